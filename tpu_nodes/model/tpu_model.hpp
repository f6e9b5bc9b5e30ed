// The analytical TPU performance model: prices a traced kernel (its pallas_calls and the work
// outside them) or an XLA program (a reference) on one chip, in closed form over grid axes.
// Every figure it writes is labelled modeled.
#pragma once

#include "config/chip.hpp"
#include "maxkernel/schema/kernel_structure.capnp.h"
#include "maxkernel/schema/profile.capnp.h"

#include <string>

namespace maxkernel::tpu_nodes::model {

struct model_result {
  bool compiles = true;        // false: the real compiler would refuse it (VMEM OOM)
  std::string compile_error;   // "VMEM OOM: needs X MiB, limit Y MiB (pallas_call NAME)"
  double time_us = 0;
};

// A candidate: every pallas_call as a software pipeline, the rest as XLA fusions.
model_result price_kernel(schema::KernelStructure::Reader structure, const config::chip& chip,
                          schema::Profile::Builder profile);

// An XLA program (the spec's reference) from its dataflow graph.
model_result price_xla(schema::DataflowGraph::Reader graph, const config::chip& chip,
                       schema::Profile::Builder profile);

}  // namespace maxkernel::tpu_nodes::model
