// One entry of `inputs:`: an array input (shape, dtype, generator) or a static argument.
#pragma once

#include "config/field_reader.hpp"
#include "config/native_spec.hpp"

#include <vector>

namespace maxkernel::config {

constexpr size_t max_rank = 8;

native_input parse_input(const YAML::Node& node, const std::string& field,
                         const std::vector<named_dim>& dims, const field_reader& reader);

// A Python-identifier-like name: [A-Za-z_][A-Za-z0-9_]*.
bool is_identifier(std::string_view name);

}  // namespace maxkernel::config
