// The top level of a native spec: YAML document -> validated native_spec.
#pragma once

#include "config/field_reader.hpp"
#include "config/native_spec.hpp"

#include <cstdint>
#include <filesystem>
#include <string>

namespace maxkernel::config {

struct spec_parse_context {
  std::filesystem::path spec_dir;  // absolute, canonical: files the spec names stay inside
  std::string source_path;         // absolute path of the spec
  std::string chip_override;       // already validated; wins over the spec's chip
  uint64_t memory_limit_bytes = 8ull << 30;
};

// Throws spec_failure on the first error.
native_spec parse_native_spec(const YAML::Node& root, const spec_parse_context& ctx,
                              const field_reader& reader);

// Total bytes of the array inputs, saturating at UINT64_MAX instead of overflowing.
uint64_t input_bytes(const native_input& input);

}  // namespace maxkernel::config
