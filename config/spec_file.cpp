#include "config/spec_file.hpp"

#include "config/utf8_check.hpp"

#include <fmt/format.h>

#include <algorithm>
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
  // Sized by the stat plus one byte, which tells a file that grew since; a grown file is read
  // on, at most one byte past the limit. (Not a buffer of the limit's size: a 1 MiB string,
  // zeroed, for every spec and chip file read raised glibc's mmap threshold to 1 MiB and left
  // a resident megabyte in each malloc arena a submission's thread used; docs/reliability.md.)
  std::string text(static_cast<size_t>(size) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  auto got = static_cast<size_t>(in.gcount());
  bool grew = got == text.size();
  text.resize(got);
  while (grew && text.size() <= max_spec_file_bytes) {
    char chunk[4096];
    auto want = std::min(sizeof chunk, static_cast<size_t>(max_spec_file_bytes) + 1 - text.size());
    in.read(chunk, static_cast<std::streamsize>(want));
    got = static_cast<size_t>(in.gcount());
    text.append(chunk, got);
    grew = got == want;
  }
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
