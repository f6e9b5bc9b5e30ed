#include "temp_spec_dir.hpp"

#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace maxkernel::config::test {

namespace fs = std::filesystem;

temp_spec_dir::temp_spec_dir() {
  std::string pattern = (fs::temp_directory_path() / "maxkernel_config_XXXXXX").string();
  if (!mkdtemp(pattern.data()))
    throw std::runtime_error("mkdtemp failed");
  dir_ = fs::canonical(pattern);
}

temp_spec_dir::~temp_spec_dir() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string temp_spec_dir::write(const std::string& relative, const std::string& content) const {
  fs::path p = dir_ / relative;
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << content;
  return p.string();
}

void load(const std::string& path, load_result& out, const spec_load_options& opts) {
  out.ok = load_native_spec(path, opts, out.spec, out.error);
}

}  // namespace maxkernel::config::test
