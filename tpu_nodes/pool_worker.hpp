// One JAX worker of a pool: a worker_client owned by its own actor. Its calls block for
// seconds, so in a running system the actor is detached (a thread of its own); that thread
// also forks the worker process, whose PR_SET_PDEATHSIG fires when the forking thread ends,
// so it must live as long as the worker does.
#pragma once

#include "tpu_nodes/worker_options.hpp"

#include <caf/fwd.hpp>

#include <chrono>
#include <string>

namespace maxkernel::tpu_nodes {

struct pool_worker_settings {
  unsigned index = 0;
  std::string backend = "model";
  worker_options options;
  std::chrono::milliseconds backoff_initial{1'000};
  std::chrono::milliseconds backoff_max{60'000};
};

// The worker starts at once and reports to `pool` (ready / wdown); it serves jobs the pool
// sends ((evaluate|load|analyze), job id, argument, budget ms) with one `done` message
// each. `detached` is false only under CAF's deterministic test scheduler, which must run
// every actor itself. The worker ends when the pool does.
caf::actor spawn_pool_worker(caf::actor_system& sys, pool_worker_settings settings,
                             const caf::actor_addr& pool, bool detached);

}  // namespace maxkernel::tpu_nodes
