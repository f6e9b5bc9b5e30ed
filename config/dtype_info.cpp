#include "config/dtype_info.hpp"

#include <array>
#include <limits>

namespace maxkernel::config {

namespace {

constexpr int64_t i64min = std::numeric_limits<int64_t>::min();
constexpr int64_t i64max = std::numeric_limits<int64_t>::max();

constexpr std::array<dtype_info, 12> dtypes{{
    {"bfloat16", 2, true, false, 0, 0},
    {"float32", 4, true, false, 0, 0},
    {"float16", 2, true, false, 0, 0},
    {"float8_e4m3fn", 1, true, false, 0, 0},
    {"float8_e5m2", 1, true, false, 0, 0},
    {"int8", 1, false, false, -128, 127},
    {"int16", 2, false, false, -32768, 32767},
    {"int32", 4, false, false, -2147483648LL, 2147483647LL},
    {"int64", 8, false, false, i64min, i64max},
    {"uint8", 1, false, false, 0, 255},
    {"uint32", 4, false, false, 0, 4294967295LL},
    {"bool", 1, false, true, 0, 1},
}};

}  // namespace

std::optional<dtype_info> find_dtype(std::string_view name) {
  for (const auto& d : dtypes)
    if (d.name == name)
      return d;
  return std::nullopt;
}

std::vector<std::string> dtype_names() {
  std::vector<std::string> out;
  for (const auto& d : dtypes)
    out.emplace_back(d.name);
  return out;
}

}  // namespace maxkernel::config
