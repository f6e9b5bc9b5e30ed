#include "cli/task_path.hpp"

#include <filesystem>

namespace maxkernel::cli {

bool inside_task(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos)
    return false;
  for (auto& part : std::filesystem::path(path))
    if (part == ".." || part == "." || part.empty())
      return false;
  return true;
}

}  // namespace maxkernel::cli
