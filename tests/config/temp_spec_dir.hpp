// A fresh temporary directory for spec files, removed with the object.
#pragma once

#include "config/native_spec_loader.hpp"

#include <capnp/message.h>

#include <filesystem>
#include <string>

namespace maxkernel::config::test {

class temp_spec_dir {
public:
  temp_spec_dir();
  ~temp_spec_dir();
  temp_spec_dir(const temp_spec_dir&) = delete;
  temp_spec_dir& operator=(const temp_spec_dir&) = delete;

  const std::filesystem::path& path() const { return dir_; }
  // Writes `content` to dir/relative (creating parent folders) and returns the full path.
  std::string write(const std::string& relative, const std::string& content) const;

private:
  std::filesystem::path dir_;
};

// A loaded spec and its error, owning the message the spec lives in.
struct load_result {
  bool ok = false;
  spec_error error;
  capnp::MallocMessageBuilder message;
  schema::KernelSpec::Builder spec = message.initRoot<schema::KernelSpec>();
};

void load(const std::string& path, load_result& out, const spec_load_options& opts = {});

}  // namespace maxkernel::config::test
