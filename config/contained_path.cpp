#include "config/contained_path.hpp"

#include "config/shown_value.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace maxkernel::config {

namespace fs = std::filesystem;

namespace {

bool is_inside(const fs::path& dir, const fs::path& p) {
  auto d = dir.begin(), de = dir.end();
  auto q = p.begin(), qe = p.end();
  for (; d != de; ++d, ++q) {
    if (d->empty())  // a trailing separator in dir
      continue;
    if (q == qe || *d != *q)
      return false;
  }
  return true;
}

}  // namespace

contained_path_result resolve_contained_file(const fs::path& spec_dir, const std::string& value) {
  contained_path_result out;
  if (value.empty()) {
    out.error = "the path is empty";
    return out;
  }
  if (value.find('\0') != std::string::npos) {
    out.error = "the path contains a NUL byte";
    return out;
  }
  std::string shown = shown_value(value);
  fs::path given(value);
  fs::path joined = (given.is_absolute() ? given : spec_dir / given).lexically_normal();
  if (!is_inside(spec_dir, joined)) {
    out.error = fmt::format("'{}' is outside the spec's directory {}; files a spec names must "
                            "sit beside it or below it",
                            shown, spec_dir.string());
    return out;
  }
  std::error_code ec;
  auto status = fs::status(joined, ec);
  if (ec || !fs::exists(status)) {
    out.error = fmt::format("'{}' does not exist (looked for {})", shown, joined.string());
    return out;
  }
  fs::path real = fs::canonical(joined, ec);
  if (ec) {
    out.error = fmt::format("cannot resolve '{}': {}", shown, ec.message());
    return out;
  }
  if (!is_inside(spec_dir, real)) {
    out.error = fmt::format("'{}' leads through a symlink to {}, outside the spec's directory {}",
                            shown, real.string(), spec_dir.string());
    return out;
  }
  if (!fs::is_regular_file(status)) {
    out.error = fmt::format("'{}' is not a regular file", shown);
    return out;
  }
  out.path = real;
  return out;
}

}  // namespace maxkernel::config
