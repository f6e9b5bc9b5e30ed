// How a worker pool starts and restarts its JAX workers.
#pragma once

#include "tpu_nodes/worker_options.hpp"

#include <chrono>
#include <string>

namespace maxkernel::tpu_nodes {

struct pool_config {
  std::string backend = "model";   // model | jax-tpu
  // Workers to run; 0: one per CPU core (model), one per TPU device of the host (jax-tpu).
  unsigned workers = 0;
  worker_options worker = worker_options::defaults();
  // A worker that cannot (re)start is retried after `backoff_initial`, doubling each
  // failure up to `backoff_max`.
  std::chrono::milliseconds backoff_initial{1'000};
  std::chrono::milliseconds backoff_max{60'000};
};

// The number of workers `config` asks for, 0 resolved for this host.
unsigned resolved_worker_count(const pool_config& config);
// TPU chips this host exposes (/dev/accel*, /dev/vfio/*); 0 without a TPU.
unsigned tpu_chips_on_host();
// How to start worker `index`: on jax-tpu it sees only chip `index` (untested without a TPU).
worker_options worker_options_for(const pool_config& config, unsigned index);

}  // namespace maxkernel::tpu_nodes
