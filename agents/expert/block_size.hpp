// The block size a kernel really uses for a requested one: the largest divisor of the
// dimension that is a multiple of the alignment and at most the request, else the whole
// dimension (always legal on TPU). Rendered kernels apply the same rule at trace time (so
// they stay correct at reduced shapes); the playbook applies it to know whether two
// requests are really different kernels.
#pragma once

#include <cstdint>

namespace maxkernel::agents::expert {

inline int64_t effective_block(int64_t extent, int64_t align, int64_t want) {
  if (extent <= 0)
    return extent;
  if (align <= 0)
    align = 1;
  if (want >= extent)
    return extent;
  for (int64_t b = (want / align) * align; b >= align; b -= align)
    if (extent % b == 0)
      return b;
  return extent;
}

}  // namespace maxkernel::agents::expert
