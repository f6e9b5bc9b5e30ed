// Resolution of a file named in a spec (reference_file, baseline): relative to the spec's
// directory, and never outside it (no `..` escapes, no absolute paths elsewhere, no symlinks
// that lead out).
#pragma once

#include <filesystem>
#include <string>

namespace maxkernel::config {

struct contained_path_result {
  std::filesystem::path path;  // absolute and symlink-free on success
  std::string error;           // "" on success
};

// `spec_dir` must be absolute and canonical. The result names an existing regular file
// inside spec_dir (at any depth).
contained_path_result resolve_contained_file(const std::filesystem::path& spec_dir,
                                             const std::string& value);

}  // namespace maxkernel::config
