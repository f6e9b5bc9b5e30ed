// The command line of `maxkernel workload` (docs/workloads.md), registered by main().
#pragma once

#include "cli/workload_command.hpp"

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace maxkernel::cli {

// Adds the `workload` subcommand to `app`, filling `opts`; returns it (test it with `*cmd`).
CLI::App* add_workload_command(CLI::App& app, workload_options& opts,
                               const std::vector<std::string>& chips);

}  // namespace maxkernel::cli
