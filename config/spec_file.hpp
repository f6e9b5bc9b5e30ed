// Reading a spec (or a file it names) from disk with the limits a user file deserves.
#pragma once

#include "config/spec_error.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace maxkernel::config {

constexpr uint64_t max_spec_file_bytes = 1u << 20;  // 1 MiB: a spec or a reference module

// Reads `path` when it is a regular file of at most max_spec_file_bytes of UTF-8 text.
// On failure fills err.line/column/message (not file or field: the caller knows those).
std::optional<std::string> read_text_file(const std::string& path, spec_error& err);

}  // namespace maxkernel::config
