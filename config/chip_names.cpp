#include "config/chip_names.hpp"

#include "config/chip_loader.hpp"

#include <algorithm>
#include <filesystem>

namespace maxkernel::config {

namespace fs = std::filesystem;

bool is_chip_name(std::string_view name) {
  if (name.empty() || name.size() > 64 || name[0] == '.')
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.';
  });
}

std::vector<std::string> chip_names_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    std::error_code type_ec;
    if (p.extension() != ".yaml" || !fs::is_regular_file(p, type_ec))  // follows symlinks
      continue;
    std::string stem = p.stem().string();
    if (is_chip_name(stem))
      names.push_back(std::move(stem));
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> chip_names() { return chip_names_in(chips_dir()); }

bool is_known_chip(std::string_view name) {
  if (!is_chip_name(name))
    return false;
  auto names = chip_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace maxkernel::config
