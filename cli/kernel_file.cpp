#include "cli/kernel_file.hpp"

#include "config/utf8_check.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace maxkernel::cli {

namespace fs = std::filesystem;

namespace {
constexpr uint64_t max_kernel_bytes = 1 << 20;
}  // namespace

bool read_kernel(const std::string& path, std::string& source, std::string& error) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    error = path + ": no such kernel file";
    return false;
  }
  if (fs::file_size(path, ec) > max_kernel_bytes) {
    error = path + ": kernel file is larger than 1 MiB";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof()) {
    error = path + ": cannot read the kernel file";
    return false;
  }
  source = ss.str();
  // Python source must be UTF-8; the worker could not even decode the candidate otherwise.
  if (auto problem = config::find_invalid_text(source, /*controls_allowed=*/true)) {
    error = path + ":" + std::to_string(problem->line) + ":" + std::to_string(problem->column)
            + ": " + problem->message;
    return false;
  }
  // Python refuses NUL in source, and the kernel travels as Cap'n Proto Text, which would cut
  // it at the NUL: the worker would test a silently truncated kernel.
  if (auto nul = source.find('\0'); nul != std::string::npos) {
    auto line_start = source.rfind('\n', nul);
    auto line = 1 + std::count(source.begin(), source.begin() + static_cast<std::ptrdiff_t>(nul), '\n');
    auto column = nul - (line_start == std::string::npos ? 0 : line_start + 1) + 1;
    error = path + ":" + std::to_string(line) + ":" + std::to_string(column)
            + ": a NUL byte; Python source cannot hold one";
    return false;
  }
  return true;
}

}  // namespace maxkernel::cli
