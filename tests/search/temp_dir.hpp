// A fresh temporary directory for store files, removed with the object.
#pragma once

#include <filesystem>
#include <string>

namespace maxkernel::search::test {

class temp_dir {
public:
  temp_dir();
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const { return dir_; }
  std::string file(const std::string& relative) const { return (dir_ / relative).string(); }
  // Writes bytes to dir/relative and returns the full path.
  std::string write(const std::string& relative, const std::string& bytes) const;

private:
  std::filesystem::path dir_;
};

}  // namespace maxkernel::search::test
