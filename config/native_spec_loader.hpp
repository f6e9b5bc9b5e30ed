// Reads a native YAML task spec (docs/spec-format.md) into a KernelSpec.
#pragma once

#include "config/spec_error.hpp"

#include "maxkernel/schema/kernel_spec.capnp.h"

#include <cstdint>
#include <string>

namespace maxkernel::config {

struct spec_load_options {
  std::string chip_override;                 // --chip; beats the spec's chip when set
  uint64_t memory_limit_bytes = 8ull << 30;  // total input bytes above this are too_large
};

// Reads and validates a native YAML spec; on success fills `out` (a KernelSpec) and returns
// true. On failure returns false with `err` set and leaves `out` untouched. Never throws.
bool load_native_spec(const std::string& path, const spec_load_options& opts,
                      maxkernel::schema::KernelSpec::Builder out, spec_error& err);

}  // namespace maxkernel::config
