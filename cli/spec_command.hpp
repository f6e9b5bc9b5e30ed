// `maxkernel spec SPEC`: how a task spec was read: its dims, inputs, generators, tolerances.
#pragma once

#include <cstdint>
#include <string>

namespace maxkernel::cli {

struct spec_options {
  std::string spec;
  std::string chip;
  std::string json;      // "" none, "-" stdout, else a file: the KernelSpec as JSON
  std::string out;       // a file receiving the KernelSpec as binary Cap'n Proto
  uint64_t memory_limit_bytes = 8ull << 30;
};

int run_spec(const spec_options& opts);

}  // namespace maxkernel::cli
