// The element types a native spec may use (numpy/JAX names) and what the loader needs to
// know about each.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace maxkernel::config {

struct dtype_info {
  std::string_view name;
  uint32_t itemsize = 0;  // bytes per element
  bool is_float = false;
  bool is_bool = false;
  int64_t min = 0;  // value range of integer and bool types
  int64_t max = 0;

  bool is_integer() const { return !is_float && !is_bool; }
};

std::optional<dtype_info> find_dtype(std::string_view name);
std::vector<std::string> dtype_names();

}  // namespace maxkernel::config
