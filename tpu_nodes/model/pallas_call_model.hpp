// One pallas_call priced as Pallas runs it: a software pipeline over the grid in which an
// input block is copied HBM -> VMEM only when its block index changes between consecutive
// steps, outputs are written back when theirs changes, and double buffering overlaps the
// copies for step i+1 with the compute of step i. Closed form over the grid's axes.
#pragma once

#include "maxkernel/schema/kernel_structure.capnp.h"
#include "tpu_nodes/model/call_estimate.hpp"
#include "tpu_nodes/model/device_rates.hpp"

namespace maxkernel::tpu_nodes::model {

call_estimate price_pallas_call(schema::PallasCall::Reader call, const device_rates& rates);

}  // namespace maxkernel::tpu_nodes::model
