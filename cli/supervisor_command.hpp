// `maxkernel supervisor`: a cluster's supervisor process. It keeps the evaluation store and
// the search graphs (--state-dir), publishes the dispatcher on the node port for
// `maxkernel node` processes to join, and serves the client port where `maxkernel optimize
// --cluster` submits tasks (cli/submission_server). Runs until SIGINT / SIGTERM.
#pragma once

#include <string>

namespace maxkernel::cli {

struct supervisor_command_options {
  std::string config;        // cluster.yaml ("": none)
  std::string listen;        // node port HOST:PORT (flag over file; default 127.0.0.1:7400)
  std::string shell_listen;  // client port HOST:PORT (default 127.0.0.1:7401)
  std::string state_dir;
  std::string token_file;
  double deadline_seconds = 600;
  bool resume = false;  // run again what a killed supervisor left unfinished
};

// 0 after a clean stop; 2 bad input (config, flags, credentials, a port in use).
int run_supervisor(const supervisor_command_options& opts);

}  // namespace maxkernel::cli
