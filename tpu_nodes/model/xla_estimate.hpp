// What the model predicts for an XLA program (a reference, or the work a candidate does
// outside its pallas_calls), before it goes into a Profile.
#pragma once

#include <string>
#include <vector>

namespace maxkernel::tpu_nodes::model {

struct xla_estimate {
  double time_us = 0;
  double compute_us = 0;          // fusions' compute, overlapped with their own traffic
  double memory_us = 0;           // fusions' HBM traffic at XLA's bandwidth
  double overhead_us = 0;         // one launch per fusion
  double flops = 0;
  double matmul_flops = 0;
  double hbm_bytes = 0;
  unsigned fusions = 0;
  std::string bound;              // compute, memory, overhead
  std::vector<std::string> unmodeled;
};

}  // namespace maxkernel::tpu_nodes::model
