// `maxkernel check SPEC KERNEL.py`: load, lower, test (and time on a TPU host) one kernel.
#pragma once

#include <string>
#include <vector>

namespace maxkernel::cli {

struct check_options {
  std::string spec;
  std::string kernel;
  bool baseline = false;       // check the spec's baseline kernel instead of `kernel`
  std::string chip;            // overrides the spec's
  bool full = false;           // test at full size instead of reduced configurations
  std::string json;            // "" none, "-" stdout, else a file
  std::vector<uint64_t> seeds;
  double deadline_seconds = 600;  // per worker request
  uint64_t memory_limit_bytes = 8ull << 30;
  bool reference_only = false;   // model (or time) the spec's reference alone
  std::string state_dir;         // "" = the default state directory (evaluation store)
  bool no_store = false;
  unsigned simulate_device_ms = 0;  // model backend: simulated device time per evaluation         // neither read nor record the evaluation store
};

// Returns the process exit code (ARCHITECTURE.md, "Contracts").
int run_check(const check_options& opts);

}  // namespace maxkernel::cli
