#include "config/chip_names.hpp"

#include <algorithm>

namespace maxkernel::config {

const std::vector<std::string>& chip_names() {
  static const std::vector<std::string> names{"v4", "v5e", "v5p", "v6e", "v7x"};
  return names;
}

bool is_known_chip(std::string_view name) {
  const auto& names = chip_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace maxkernel::config
