#include "cli/output_file.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <iostream>

namespace maxkernel::cli {

namespace fs = std::filesystem;

bool write_output(const std::string& target, const std::string& text, std::string& error) {
  if (target == "-") {
    std::cout << text << std::flush;
    return true;
  }
  auto tmp = target + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      error = "cannot write " + tmp;
      std::error_code ec;
      fs::remove(tmp, ec);
      return false;
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    error = "cannot write " + target + ": " + ec.message();
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

bool output_dir_exists(const std::string& target, std::string& error) {
  if (target.empty() || target == "-")
    return true;
  auto parent = fs::absolute(target).parent_path();
  if (fs::is_directory(parent))
    return true;
  error = target + ": directory " + parent.string() + " does not exist";
  return false;
}

bool make_output_dir(const std::string& dir, std::string& error) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    error = "--out " + dir + ": not a directory it can create";
    return false;
  }
  return true;
}

std::string read_whole_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream data;
  data << in.rdbuf();
  return data.str();
}

}  // namespace maxkernel::cli
