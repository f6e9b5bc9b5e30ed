#include "tpu_nodes/worker_options.hpp"

#include "messages/version.hpp"

#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace maxkernel::tpu_nodes {

namespace {
std::mutex hidden_mutex;
std::vector<std::string>& hidden_paths() {
  static std::vector<std::string> paths;
  return paths;
}

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
  std::lock_guard lock(hidden_mutex);
  opts.hide = hidden_paths();
  return opts;
}

void hide_from_workers(const std::string& path) {
  if (path.empty())
    return;
  std::error_code ec;
  auto absolute = std::filesystem::absolute(path, ec);
  std::lock_guard lock(hidden_mutex);
  hidden_paths().push_back(ec ? path : absolute.lexically_normal().string());
}

}  // namespace maxkernel::tpu_nodes
