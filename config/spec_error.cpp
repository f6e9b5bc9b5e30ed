#include "config/spec_error.hpp"

namespace maxkernel::config {

std::string spec_error::what() const {
  std::string out;
  if (!file.empty()) {
    out += file;
    if (line > 0) {
      out += ':' + std::to_string(line);
      if (column > 0)
        out += ':' + std::to_string(column);
    }
    out += ": ";
  }
  if (!field.empty())
    out += field + ": ";
  out += message;
  return out;
}

}  // namespace maxkernel::config
