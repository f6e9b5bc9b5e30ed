#include "config/utf8_check.hpp"

#include <fmt/format.h>

namespace maxkernel::config {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0.
size_t sequence_length(std::string_view s, size_t i, char32_t& cp) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  unsigned char c = b(0);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF && cont(1)) {
    cp = ((c & 0x1F) << 6) | (b(1) & 0x3F);
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF && cont(1) && cont(2)) {
    cp = ((c & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))
      return 0;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    cp = ((c & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    if (cp < 0x10000 || cp > 0x10FFFF)
      return 0;
    return 4;
  }
  return 0;
}

}  // namespace

std::optional<text_problem> find_invalid_text(std::string_view text, bool controls_allowed) {
  int line = 1, column = 1;
  size_t i = 0;
  if (text.substr(0, 3) == "\xEF\xBB\xBF")
    i = 3;
  while (i < text.size()) {
    char32_t cp = 0;
    size_t len = sequence_length(text, i, cp);
    if (len == 0)
      return text_problem{line, column,
                          fmt::format("invalid UTF-8 (byte 0x{:02X}); the text must be UTF-8",
                                      static_cast<unsigned char>(text[i]))};
    bool control = (cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') || cp == 0x7F ||
                   (cp >= 0x80 && cp <= 0x9F && cp != 0x85) || cp == 0xFFFE || cp == 0xFFFF ||
                   (cp == 0xFEFF && i != 0);
    if (control && !controls_allowed)
      return text_problem{line, column,
                          fmt::format("control character U+{:04X} is not allowed in YAML",
                                      static_cast<uint32_t>(cp))};
    if (cp == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    i += len;
  }
  return std::nullopt;
}

}  // namespace maxkernel::config
