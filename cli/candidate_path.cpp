#include "cli/candidate_path.hpp"

#include <regex>

namespace maxkernel::cli {

std::string with_kernel_path(const std::string& message, const std::string& kernel_path) {
  if (kernel_path.empty() || message.find("maxkernel_candidate_") == std::string::npos)
    return message;
  static const std::regex copy(R"([^\s'"()\[\],:]*maxkernel_candidate_[0-9a-f]{16}\.py)");
  // Spliced by hand, not regex_replace: a '$' in the user's path is not a back-reference.
  std::string out;
  size_t at = 0;
  for (std::sregex_iterator it(message.begin(), message.end(), copy), end; it != end; ++it) {
    out.append(message, at, static_cast<size_t>(it->position()) - at);
    out += kernel_path;
    at = static_cast<size_t>(it->position() + it->length());
  }
  out.append(message, at, std::string::npos);
  return out;
}

}  // namespace maxkernel::cli
