// An XLA program priced from its dataflow graph as XLA's TPU compiler would run it: what lands
// in HBM is every result of a dot, convolution, reduce, gather, scatter or opaque op, every
// graph output and every value crossing a loop boundary; each such result is one fusion that
// recomputes the elementwise work behind it (XLA duplicates cheap producers into their
// consumers) and reads the materialized values at its frontier. A dot whose value flows
// through elementwise ops into one result only is fused into it (output fusion).
#pragma once

#include "maxkernel/schema/kernel_structure.capnp.h"
#include "tpu_nodes/model/device_rates.hpp"
#include "tpu_nodes/model/xla_estimate.hpp"

namespace maxkernel::tpu_nodes::model {

xla_estimate price_xla_graph(schema::DataflowGraph::Reader graph, const device_rates& rates);

}  // namespace maxkernel::tpu_nodes::model
