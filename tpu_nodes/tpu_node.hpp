// A TPU node: one device as an actor. It answers evaluations from the evaluation store when
// it can, hands the rest to the worker pool behind it, records what comes back, and keeps
// its queue bounded (beyond `queue_capacity` requests in flight it refuses with
// `overloaded`) and every request within its deadline (then `worker_timeout`).
// docs/tpu-node.md describes the protocol.
#pragma once

#include "messages/tpu_node_actor.hpp"
#include "messages/worker_pool_actor.hpp"
#include "tpu_nodes/node_config.hpp"

namespace maxkernel::tpu_nodes {

messages::tpu_node_actor spawn_tpu_node(caf::actor_system& sys, node_config config,
                                        messages::worker_pool_actor pool);

}  // namespace maxkernel::tpu_nodes
