// The worker pool of a node process: N JAX workers, each in its own actor, fed from one
// FIFO queue of jobs. Several tpu_nodes share one pool. A worker that cannot (re)start is
// retried with exponential backoff; while every worker is down, jobs are refused with
// worker_unavailable instead of waiting for their deadlines.
#pragma once

#include "messages/worker_pool_actor.hpp"
#include "tpu_nodes/pool_config.hpp"

namespace maxkernel::tpu_nodes {

// Under CAF's deterministic test scheduler (scheduler.policy = testing) the workers are
// ordinary actors run by the test coordinator; otherwise each is detached.
messages::worker_pool_actor spawn_worker_pool(caf::actor_system& sys, pool_config config);

}  // namespace maxkernel::tpu_nodes
