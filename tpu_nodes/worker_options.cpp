#include "tpu_nodes/worker_options.hpp"

#include "messages/version.hpp"

#include <cstdlib>
#include <filesystem>

namespace maxkernel::tpu_nodes {

namespace {
std::string env_or(const char* name, std::string fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::string(value) : std::move(fallback);
}
}  // namespace

worker_options worker_options::defaults() {
  worker_options opts;
  opts.python = env_or("MAXKERNEL_PYTHON", MAXKERNEL_SOURCE_DIR "/.venv/bin/python");
  opts.package_dir = env_or("MAXKERNEL_WORKER_DIR", MAXKERNEL_SOURCE_DIR "/tpu_nodes/worker");
  opts.schema_dir = messages::schema_dir();
  opts.work_root = env_or("MAXKERNEL_WORK_ROOT", std::filesystem::temp_directory_path().string());
  opts.sandbox = env_or("MAXKERNEL_NO_SANDBOX", "") != "1";
  return opts;
}

}  // namespace maxkernel::tpu_nodes
