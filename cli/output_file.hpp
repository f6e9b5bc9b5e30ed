// Writing a command's output file whole or not at all, and reading one back.
#pragma once

#include <filesystem>
#include <string>

namespace maxkernel::cli {

// Writes `text` to `target` through a temporary file and a rename, so a reader never sees
// half a file; "-" writes to stdout. False with `error` set when the file cannot be written.
bool write_output(const std::string& target, const std::string& text, std::string& error);

// Creates the --out directory `dir` (and its parents); false with `error` when it cannot.
bool make_output_dir(const std::string& dir, std::string& error);

// Checks before any work that `target`'s directory exists ("-" and "" always pass).
bool output_dir_exists(const std::string& target, std::string& error);

// The bytes of the file at `path` ("" when it cannot be read).
std::string read_whole_file(const std::filesystem::path& path);

}  // namespace maxkernel::cli
