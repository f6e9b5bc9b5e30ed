// How to start a JAX worker: interpreter, package location, limits and environment.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace maxkernel::tpu_nodes {

struct worker_options {
  std::string python;        // the venv's interpreter
  std::string package_dir;   // directory holding the maxkernel_worker package
  std::string schema_dir;    // messages/schema
  std::string work_root;     // private working directories are made below it
  uint64_t memory_limit_bytes = 0;   // 0: the worker's default
  bool sandbox = true;
  // Directories and files the worker's candidates must not see (the cluster token, the
  // node's state): covered by empty mounts in the worker's private mount namespace.
  std::vector<std::string> hide;
  std::vector<std::pair<std::string, std::string>> extra_env;  // e.g. JAX_PLATFORMS
  std::chrono::milliseconds start_timeout{120'000};

  // Defaults from the build tree, overridable by MAXKERNEL_PYTHON, MAXKERNEL_WORKER_DIR,
  // MAXKERNEL_WORK_ROOT and MAXKERNEL_NO_SANDBOX=1 in the environment; `hide` holds every
  // path given to hide_from_workers.
  static worker_options defaults();
};

// Hides `path` from every worker this process starts from now on (options made by
// worker_options::defaults()): the node and supervisor commands name their credentials and
// state here once, before any worker pool exists, whatever builds the pool's options.
void hide_from_workers(const std::string& path);

}  // namespace maxkernel::tpu_nodes
