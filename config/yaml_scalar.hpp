// Resolution of YAML scalars by the YAML 1.2 core schema: a plain scalar may be null, a
// bool, an int or a float; a quoted one is always a string. (yaml-cpp leaves this to us.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace maxkernel::config {

struct yaml_scalar {
  enum class kind { null_value, boolean, integer, floating, string };
  kind type = kind::string;
  bool boolean_value = false;
  int64_t integer_value = 0;
  double float_value = 0;
  bool out_of_range = false;  // an integer literal that does not fit in int64
  std::string text;           // as written
};

yaml_scalar resolve_scalar(std::string_view text, bool plain);

// "an integer", "a float", ... for error messages.
const char* kind_name(yaml_scalar::kind k);

}  // namespace maxkernel::config
