#include "config/yaml_scalar.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace maxkernel::config {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool all_of(std::string_view s, bool (*pred)(char)) {
  if (s.empty())
    return false;
  for (char c : s)
    if (!pred(c))
      return false;
  return true;
}

bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool is_oct(char c) { return c >= '0' && c <= '7'; }

// [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?   (hand-written: std::regex
// recurses per character and can overflow the stack on long input)
bool is_core_float(std::string_view s) {
  size_t i = 0, n = s.size();
  if (i < n && (s[i] == '+' || s[i] == '-'))
    ++i;
  size_t int_digits = 0, frac_digits = 0;
  while (i < n && is_digit(s[i]))
    ++i, ++int_digits;
  if (i < n && s[i] == '.') {
    ++i;
    while (i < n && is_digit(s[i]))
      ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0)
    return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-'))
      ++i;
    size_t exp_digits = 0;
    while (i < n && is_digit(s[i]))
      ++i, ++exp_digits;
    if (exp_digits == 0)
      return false;
  }
  return i == n;
}

void set_integer(yaml_scalar& out, std::string_view digits, int base, bool negative) {
  out.type = yaml_scalar::kind::integer;
  // Parse the magnitude unsigned so that INT64_MIN is representable.
  uint64_t magnitude = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) {
    out.out_of_range = true;
    return;
  }
  constexpr uint64_t max_pos = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (negative) {
    if (magnitude > max_pos + 1)
      out.out_of_range = true;
    else
      out.integer_value = magnitude == max_pos + 1 ? std::numeric_limits<int64_t>::min()
                                                   : -static_cast<int64_t>(magnitude);
  } else if (magnitude > max_pos) {
    out.out_of_range = true;
  } else {
    out.integer_value = static_cast<int64_t>(magnitude);
  }
}

}  // namespace

yaml_scalar resolve_scalar(std::string_view text, bool plain) {
  yaml_scalar out;
  out.text = std::string(text);
  if (!plain)
    return out;
  std::string_view s = text;
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") {
    out.type = yaml_scalar::kind::null_value;
    return out;
  }
  if (s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE") {
    out.type = yaml_scalar::kind::boolean;
    out.boolean_value = s[0] == 't' || s[0] == 'T';
    return out;
  }
  {
    bool negative = false;
    std::string_view body = s;
    if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
      negative = body[0] == '-';
      body.remove_prefix(1);
    }
    if (all_of(body, is_digit)) {
      set_integer(out, body, 10, negative);
      return out;
    }
  }
  if (s.size() > 2 && s[0] == '0' && s[1] == 'x' && all_of(s.substr(2), is_hex)) {
    set_integer(out, s.substr(2), 16, false);
    return out;
  }
  if (s.size() > 2 && s[0] == '0' && s[1] == 'o' && all_of(s.substr(2), is_oct)) {
    set_integer(out, s.substr(2), 8, false);
    return out;
  }
  {
    std::string_view body = s;
    bool negative = false;
    if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
      negative = body[0] == '-';
      body.remove_prefix(1);
    }
    if (body == ".inf" || body == ".Inf" || body == ".INF") {
      out.type = yaml_scalar::kind::floating;
      out.float_value = negative ? -std::numeric_limits<double>::infinity()
                                 : std::numeric_limits<double>::infinity();
      return out;
    }
    if (s == ".nan" || s == ".NaN" || s == ".NAN") {
      out.type = yaml_scalar::kind::floating;
      out.float_value = std::numeric_limits<double>::quiet_NaN();
      return out;
    }
    if (is_core_float(s)) {
      double value = 0;
      auto [ptr, ec] = std::from_chars(body.data(), body.data() + body.size(), value);
      out.type = yaml_scalar::kind::floating;
      if (ec == std::errc::result_out_of_range)
        value = std::strtod(std::string(body).c_str(), nullptr);  // 1e999 -> inf, 1e-999 -> 0
      else if (ec != std::errc() || ptr != body.data() + body.size())
        value = std::numeric_limits<double>::quiet_NaN();
      out.float_value = negative ? -value : value;
      return out;
    }
  }
  return out;
}

const char* kind_name(yaml_scalar::kind k) {
  switch (k) {
    case yaml_scalar::kind::null_value: return "null";
    case yaml_scalar::kind::boolean: return "a boolean";
    case yaml_scalar::kind::integer: return "an integer";
    case yaml_scalar::kind::floating: return "a float";
    case yaml_scalar::kind::string: return "a string";
  }
  return "a scalar";
}

}  // namespace maxkernel::config
