// native_spec -> KernelSpec (the mapping documented in docs/spec-format.md).
#pragma once

#include "config/native_spec.hpp"

#include "maxkernel/schema/kernel_spec.capnp.h"

namespace maxkernel::config {

void write_kernel_spec(const native_spec& spec, maxkernel::schema::KernelSpec::Builder out);

}  // namespace maxkernel::config
