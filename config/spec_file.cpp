#include "config/spec_file.hpp"

#include "config/utf8_check.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace maxkernel::config {

namespace fs = std::filesystem;

std::optional<std::string> read_text_file(const std::string& path, spec_error& err) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    err.message = "no such file";
    return std::nullopt;
  }
  if (!fs::is_regular_file(status)) {
    err.message = fs::is_directory(status) ? "is a directory, not a file"
                                           : "is not a regular file";
    return std::nullopt;
  }
  auto size = fs::file_size(path, ec);
  if (ec) {
    err.message = "cannot read: " + ec.message();
    return std::nullopt;
  }
  if (size > max_spec_file_bytes) {
    err.message = fmt::format("the file is {} bytes; the limit is {} (1 MiB)", size,
                              max_spec_file_bytes);
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    err.message = fmt::format("cannot open: {}", std::strerror(errno));
    return std::nullopt;
  }
  // Read at most one byte past the limit: the file may grow between stat and read.
  std::string text(max_spec_file_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) {
    err.message = "read error";
    return std::nullopt;
  }
  if (text.size() > max_spec_file_bytes) {
    err.message = fmt::format("the file is larger than the limit of {} bytes (1 MiB)",
                              max_spec_file_bytes);
    return std::nullopt;
  }
  if (auto problem = find_invalid_text(text)) {
    err.line = problem->line;
    err.column = problem->column;
    err.message = problem->message;
    return std::nullopt;
  }
  return text;
}

}  // namespace maxkernel::config
