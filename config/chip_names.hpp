// The TPU generations a spec may target.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace maxkernel::config {

const std::vector<std::string>& chip_names();  // v4 v5e v5p v6e v7x
bool is_known_chip(std::string_view name);

}  // namespace maxkernel::config
