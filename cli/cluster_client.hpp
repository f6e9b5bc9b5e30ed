// `maxkernel optimize SPEC ... --cluster HOST:PORT`: the client side of a cluster's client
// port (cli/submission_server). It sends the task's files and the options as typed, prints
// what the run prints, and writes the run's outputs (--out DIR, --json) here, as the
// embedded run would.
#pragma once

#include "cli/cluster_connection.hpp"
#include "cli/optimize_command.hpp"
#include "cli/search_controls.hpp"

#include <atomic>
#include <functional>
#include <string>
#include <vector>

namespace maxkernel::cli {

// One task submitted to the supervisor and followed to its end: what `optimize --cluster`
// does, and `bench --cluster` / `workload --cluster` for each of their tasks.
struct cluster_submission {
  std::string spec;               // a spec file or a task directory, read here
  std::vector<std::string> args;  // optimize's options (no --out, --json, --cluster)
  std::string out;                // receives the run's output files ("" none)
  std::string out_shown;          // how the run names `out` in its words
  // Each piece the run prints, with its stream (1 stdout, 2 stderr).
  std::function<void(const std::string& text, int stream)> on_output;
  // Raised (by Ctrl-C): the run is asked to stop as the shell's `stop` would, its outputs
  // still coming back; before it was submitted, it is not submitted (null: never).
  const std::atomic<bool>* interrupted = nullptr;
};

struct cluster_outcome {
  int exit_code = 3;  // the run's (0, 1, 2, 3); 2 refused, 3 no supervisor or bad answer
  std::string json;   // result.json's text ("" when the run failed before it)
  std::string error;  // the client's own reason when it did not get the run's end ("" else)
};

cluster_outcome run_cluster_submission(const cluster_submission& sub,
                                       const cluster_client_options& client);

// For interrupt_stop: a "search" that Ctrl-C stops by raising `flag`, which the
// submissions watching it (cluster_submission::interrupted) turn into the shell's `stop`.
search_controller stop_by_flag(std::atomic<bool>& flag);

// The options `bench` would give one task's search, as optimize's command line (the
// settings of `search` that a submission carries; --brains names a file on the
// supervisor's host, as with optimize --cluster; --resume resumes from the supervisor's
// state; --state-dir, --nodes, --workers are the supervisor's own).
std::vector<std::string> search_args(const optimize_options& search);

// `args`: the options to send (the command line without SPEC and the local --out, --json,
// --cluster, --token-file). The exit code of the run, 2 when refused, 3 when the supervisor
// cannot be reached or refuses our credentials.
int run_cluster_optimize(const optimize_options& opts, const std::vector<std::string>& args,
                         const cluster_client_options& client);

// Whether the supervisor answers with these credentials, before a run submits its tasks:
// 0, or 2 / 3 as run_cluster_status after writing why to `err`.
int check_cluster(const cluster_client_options& client, std::ostream& err);

// `maxkernel cluster status --cluster HOST:PORT`: the supervisor's view of its nodes and
// work on stdout. 0, 2 (bad endpoint or credentials), 3 (no answer).
int run_cluster_status(const cluster_client_options& client);

}  // namespace maxkernel::cli
