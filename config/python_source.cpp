#include "config/python_source.hpp"

namespace maxkernel::config {

namespace {

bool consume(std::string_view& s, std::string_view word) {
  if (s.substr(0, word.size()) != word)
    return false;
  s.remove_prefix(word.size());
  return true;
}

size_t skip_blanks(std::string_view& s) {
  size_t n = 0;
  while (!s.empty() && (s[0] == ' ' || s[0] == '\t'))
    s.remove_prefix(1), ++n;
  return n;
}

}  // namespace

bool defines_function(std::string_view source, std::string_view name) {
  while (!source.empty()) {
    size_t end = source.find('\n');
    std::string_view line = source.substr(0, end);
    source = end == std::string_view::npos ? std::string_view{} : source.substr(end + 1);
    // Module level only: a nested def of the same name is not the entry point.
    if (consume(line, "async"))
      if (skip_blanks(line) == 0)
        continue;
    if (!consume(line, "def") || skip_blanks(line) == 0 || !consume(line, name))
      continue;
    skip_blanks(line);
    if (!line.empty() && line[0] == '(')
      return true;
  }
  return false;
}

}  // namespace maxkernel::config
