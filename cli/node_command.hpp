// `maxkernel node`: one TPU host of a cluster. Its devices are tpu_node actors over a shared
// worker pool (cli/node_session, role node); they join the supervisor's dispatcher over the
// node port and take work from it. A node started before its supervisor, or one whose
// supervisor went away, keeps trying to join until it is stopped (SIGINT / SIGTERM).
#pragma once

#include <cstdint>
#include <string>

namespace maxkernel::cli {

struct node_command_options {
  std::string config;        // cluster.yaml ("": none; the flags and their defaults)
  std::string join;          // the supervisor's node port, HOST:PORT (flag over file)
  std::string token_file;    // the cluster's credentials
  std::string backend;       // model | jax-tpu ("": the file's, else this host's)
  unsigned devices = 0;      // 0: the file's (default 4)
  std::string chip;          // "": the file's (default v6e)
  int workers = -1;          // -1: the file's; 0: one per core
  unsigned simulate_device_ms = 0;
  std::string state_dir;     // "": no store; else a host-local store of evaluations there
  uint64_t memory_limit_bytes = 8ull << 30;
  double retry_seconds = 1;  // between attempts to join
  double deadline_seconds = 600;
};

// 0 after a clean stop; 2 bad input (config, flags, credentials file); 3 environment (the
// worker does not start, authentication failed).
int run_node(const node_command_options& opts);

}  // namespace maxkernel::cli
