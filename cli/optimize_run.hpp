// The search of one task on a running node session: what `optimize` does once its session is
// open, and what a cluster's supervisor does for each submission (cli/submission_server).
// Everything the run prints goes to the two streams given.
#pragma once

#include "cli/node_session.hpp"
#include "cli/optimize_command.hpp"
#include "cli/search_controls.hpp"
#include "config/brain_config.hpp"
#include "maxkernel/schema/kernel_spec.capnp.h"

#include <chrono>
#include <functional>
#include <ostream>
#include <string>

namespace maxkernel::cli {

// Where a run's words go.
struct run_io {
  std::ostream& human;              // the summary (stderr with --json -)
  std::ostream& err;                // errors and the progress line
  std::string* json_text = nullptr; // receives result.json's text once the search ended
  std::string out_shown;            // how the output directory is named to the user ("":
                                    // opts.out; a cluster client writes its own copy)
  // Told the search's controller once it started, and an empty one when it ended.
  std::function<void(search_controller)> on_search;
};

// The exit code of `optimize` (0 correct, 1 not, 2 bad input, 3 environment). On a cluster
// supervisor's session result.json also counts the nodes lost during the run and the
// evaluations moved off them.
int optimize_on_session(node_session& session, schema::KernelSpec::Reader spec,
                        const optimize_options& opts, const config::brain_config& brains,
                        const std::string& state_dir,
                        std::chrono::steady_clock::time_point started, run_io io);

}  // namespace maxkernel::cli
