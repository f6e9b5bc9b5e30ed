#include "temp_dir.hpp"

#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace maxkernel::search::test {

namespace fs = std::filesystem;

temp_dir::temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "maxkernel_search_XXXXXX").string();
  if (!mkdtemp(pattern.data()))
    throw std::runtime_error("mkdtemp failed");
  dir_ = fs::canonical(pattern);
}

temp_dir::~temp_dir() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string temp_dir::write(const std::string& relative, const std::string& bytes) const {
  fs::path p = dir_ / relative;
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << bytes;
  return p.string();
}

}  // namespace maxkernel::search::test
