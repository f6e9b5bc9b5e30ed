// `tolerance:`: one {atol, rtol} for every output, or a list with one entry per output.
#pragma once

#include "config/field_reader.hpp"
#include "config/native_spec.hpp"

#include <vector>

namespace maxkernel::config {

std::vector<output_tolerance> parse_tolerances(const YAML::Node& node, const std::string& field,
                                               const field_reader& reader);

}  // namespace maxkernel::config
