// An XLA program priced from its dataflow graph as XLA's TPU compiler would run it: ops are
// grouped into fusions (elementwise chains together; dot, convolution, reduce, gather and
// scatter start their own fusion, taking in their elementwise producers or consumers when they
// are the only user), and every tensor crossing a fusion boundary is a round trip through HBM.
#pragma once

#include "maxkernel/schema/kernel_structure.capnp.h"
#include "tpu_nodes/model/device_rates.hpp"
#include "tpu_nodes/model/xla_estimate.hpp"

namespace maxkernel::tpu_nodes::model {

xla_estimate price_xla_graph(schema::DataflowGraph::Reader graph, const device_rates& rates);

}  // namespace maxkernel::tpu_nodes::model
