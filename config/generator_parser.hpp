// The `generator:` of an input: how its values are drawn.
#pragma once

#include "config/dtype_info.hpp"
#include "config/field_reader.hpp"
#include "config/native_spec.hpp"

namespace maxkernel::config {

// `node` is the generator's value, or null when the input has none (then floating inputs
// default to normal(0, 1) and others are an error at `input_mark`).
input_generator parse_generator(const YAML::Node* node, const YAML::Mark& input_mark,
                                const std::string& field, const dtype_info& dtype,
                                const field_reader& reader);

}  // namespace maxkernel::config
