#include "tpu_nodes/pool_config.hpp"

#include <cctype>
#include <filesystem>
#include <string>
#include <thread>

namespace maxkernel::tpu_nodes {

namespace fs = std::filesystem;

unsigned tpu_chips_on_host() {
  // TPU VMs expose their chips as /dev/accel<N> (v2-v4) or /dev/vfio/<N> (v5e and later).
  auto count = [](const fs::path& dir, const std::string& prefix) {
    unsigned n = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      auto name = it->path().filename().string();
      if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0
          && std::isdigit(static_cast<unsigned char>(name[prefix.size()])))
        ++n;
    }
    return n;
  };
  if (auto n = count("/dev", "accel"))
    return n;
  return count("/dev/vfio", "");
}

unsigned resolved_worker_count(const pool_config& config) {
  if (config.workers > 0)
    return config.workers;
  if (config.backend == "jax-tpu") {
    auto chips = tpu_chips_on_host();
    return chips > 0 ? chips : 1;
  }
  auto cores = std::thread::hardware_concurrency();
  return cores > 0 ? cores : 1;
}

worker_options worker_options_for(const pool_config& config, unsigned index) {
  auto opts = config.worker;
  if (config.backend == "jax-tpu") {
    // One chip per worker process: libtpu otherwise lets only one process open the TPU.
    auto port = std::to_string(8476 + index);
    opts.extra_env.emplace_back("TPU_VISIBLE_CHIPS", std::to_string(index));
    opts.extra_env.emplace_back("TPU_PROCESS_BOUNDS", "1,1,1");
    opts.extra_env.emplace_back("TPU_CHIPS_PER_PROCESS_BOUNDS", "1,1,1");
    opts.extra_env.emplace_back("TPU_PROCESS_ADDRESSES", "localhost:" + port);
    opts.extra_env.emplace_back("TPU_PROCESS_PORT", port);
    opts.extra_env.emplace_back("CLOUD_TPU_TASK_ID", "0");
    opts.extra_env.emplace_back("ALLOW_MULTIPLE_LIBTPU_LOAD", "1");
  }
  return opts;
}

}  // namespace maxkernel::tpu_nodes
