// `maxkernel optimize SPEC ... --cluster HOST:PORT`: the client side of a cluster's client
// port (cli/submission_server). It sends the task's files and the options as typed, prints
// what the run prints, and writes the run's outputs (--out DIR, --json) here, as the
// embedded run would.
#pragma once

#include "cli/cluster_connection.hpp"
#include "cli/optimize_command.hpp"

#include <string>
#include <vector>

namespace maxkernel::cli {

// `args`: the options to send (the command line without SPEC and the local --out, --json,
// --cluster, --token-file). The exit code of the run, 2 when refused, 3 when the supervisor
// cannot be reached or refuses our credentials.
int run_cluster_optimize(const optimize_options& opts, const std::vector<std::string>& args,
                         const cluster_client_options& client);

// `maxkernel cluster status --cluster HOST:PORT`: the supervisor's view of its nodes and
// work on stdout. 0, 2 (bad endpoint or credentials), 3 (no answer).
int run_cluster_status(const cluster_client_options& client);

}  // namespace maxkernel::cli
