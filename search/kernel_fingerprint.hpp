// What makes two evaluated candidates the same kernel for the search: their lowered
// structure (pallas_calls with grids, blocks, semantics, the body's dots and costs, and the
// XLA work around them; not the VMEM limit, which decides only whether it compiles),
// whatever parameters or source text produced it.
// Parameters a template resolves to the same program (a dtype "auto" that means bfloat16, a
// block the kernel does not tile by at this shape) give one fingerprint.
#pragma once

#include "maxkernel/schema/kernel_structure.capnp.h"

#include <string>

namespace maxkernel::search {

// Hex sha256 of the structure's canonical capnp encoding, VMEM limits set to 0.
std::string kernel_fingerprint(schema::KernelStructure::Reader structure);

}  // namespace maxkernel::search
