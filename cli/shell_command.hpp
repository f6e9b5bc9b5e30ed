// `maxkernel shell --attach HOST:PORT`: the operator shell of a cluster (docs/cluster.md).
// Line editing, history and completion (commands, task ids and names) through libedit; `-c
// "cmd; cmd"` runs commands from a script; `--json` prints what the supervisor says as JSON.
// The commands run on the supervisor (cli/shell_service) except those that touch this
// machine: submit (its files), export (writes here) and attach (this terminal decides a hitl
// task's proposals, as `maxkernel attach`).
#pragma once

#include "cli/cluster_connection.hpp"

#include <string>

namespace maxkernel::cli {

struct shell_options {
  std::string config;  // cluster.yaml: the client port and token when the flags give none
  cluster_client_options client;
  std::string commands;  // -c: ';'-separated; "" = interactive
  bool json = false;
};

// 0: every command succeeded; 1: one failed; 2: bad input (endpoint, credentials file);
// 3: the supervisor does not answer or refuses our credentials.
int run_shell(const shell_options& opts);

}  // namespace maxkernel::cli
