// Finds the first byte of a text that is not valid UTF-8 or not allowed in YAML.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace maxkernel::config {

struct text_problem {
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in characters
  std::string message;
};

// Refuses malformed UTF-8 (overlong forms, surrogates, > U+10FFFF, truncated sequences) and,
// unless `controls_allowed` (Python source may hold a form feed), control characters other
// than tab, LF and CR. A leading UTF-8 byte-order mark is allowed.
std::optional<text_problem> find_invalid_text(std::string_view text, bool controls_allowed = false);

}  // namespace maxkernel::config
