// Internal: how the parser bails out on the first error. load_native_spec catches it; it
// never leaves the library.
#pragma once

#include "config/spec_error.hpp"

namespace maxkernel::config {

struct spec_failure {
  spec_error error;
};

}  // namespace maxkernel::config
