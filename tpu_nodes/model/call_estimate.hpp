// What the model predicts for one pallas_call (all its runs), before it goes into a Profile.
#pragma once

#include <string>
#include <vector>

namespace maxkernel::tpu_nodes::model {

struct operand_estimate {
  std::string role;               // input, output, scalarPrefetch
  unsigned index = 0;
  double copies = 0;              // block copies (inputs) or write-backs (outputs), all cores
  double bytes = 0;
};

struct call_estimate {
  std::string name;
  double count = 1;               // runs of the call; every time below covers all of them
  double time_us = 0;
  double compute_us = 0;          // step work on one core (MXU, VPU, EUP overlapped)
  double dma_us = 0;              // block copies on one core's share of the bandwidth
  double exposed_dma_us = 0;      // copy time not hidden behind compute
  double overhead_us = 0;         // launch and per-step costs
  double flops = 0;               // useful flops (matmuls unpadded + vector work)
  double matmul_flops = 0;        // useful matmul flops
  double matmul_peak = 0;         // device matmul FLOP/s at the call's operand types
  double hbm_bytes = 0;
  double steps_per_core = 0;
  unsigned cores_used = 1;
  double vmem_bytes = 0;          // peak VMEM footprint
  double vmem_limit = 0;
  bool fits = true;               // false: VMEM OOM, the compiler would refuse the kernel
  std::string bound;              // compute, memory, overhead, latency
  std::vector<operand_estimate> traffic;
  std::vector<std::string> notes;      // what a user should know (an idle core, ...)
  std::vector<std::string> unmodeled;  // what the model could not see
};

}  // namespace maxkernel::tpu_nodes::model
