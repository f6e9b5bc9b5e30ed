// `maxkernel model SPEC KERNEL.py --chip v5e,v6e,v7x`: the kernel's (and the reference's)
// modeled time and profile on several chips, side by side.
#pragma once

#include <string>
#include <vector>

namespace maxkernel::cli {

struct model_options {
  std::string spec;
  std::string kernel;
  std::vector<std::string> chips;  // empty: the spec's chip
  std::string json;                // "" none, "-" stdout, else a file
  std::string state_dir;
  bool no_store = false;
  unsigned simulate_device_ms = 0;  // model backend: simulated device time per evaluation
  double deadline_seconds = 600;
  uint64_t memory_limit_bytes = 8ull << 30;
};

int run_model(const model_options& opts);

}  // namespace maxkernel::cli
