// The evaluation store in front of TPU nodes that have none: a cluster's supervisor keeps the
// store, its nodes run on other hosts. A tpu_node to its clients: an evaluation whose result
// is stored is answered at once (cached), any other goes to `inner` (the dispatcher) and
// what comes back is recorded before it is answered, so a repeat, a resumed search or a
// restarted supervisor never evaluates it again. Load, analyze and info pass through.
#pragma once

#include "messages/tpu_node_actor.hpp"

#include <chrono>

namespace maxkernel::search {
class evaluation_store;
}

namespace maxkernel::tpu_nodes {

struct store_front_config {
  // Not owned; must outlive the actor.
  search::evaluation_store* store = nullptr;
  // Deadline of a request that names none (a tpu_node's default).
  std::chrono::milliseconds default_deadline{600'000};
  // The inner node enforces deadlines; this margin only guards against one that vanished.
  std::chrono::milliseconds reply_margin{30'000};
};

messages::tpu_node_actor spawn_store_front(caf::actor_system& sys, store_front_config config,
                                           messages::tpu_node_actor inner);

}  // namespace maxkernel::tpu_nodes
