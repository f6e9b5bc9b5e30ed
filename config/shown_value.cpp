#include "config/shown_value.hpp"

namespace maxkernel::config {

std::string shown_value(std::string_view value) {
  constexpr size_t max_chars = 40;
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(value[i]);
    bool starts_char = (c & 0xC0) != 0x80;  // cut between UTF-8 characters, not inside one
    if (starts_char && ++chars > max_chars - 3) {
      if (value.size() - i > 3) {
        out += "...";
        return out;
      }
    }
    out += c == '\n' || c == '\r' || c == '\t' ? ' ' : value[i];
  }
  return out;
}

}  // namespace maxkernel::config
