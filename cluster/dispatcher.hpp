// The dispatcher: a tpu_node to its clients, in front of N tpu_nodes. It queues evaluations
// FIFO and sends each to the live node with a free credit that serves the request's chip
// (a jax-tpu node its own, a model node any: docs/cluster.md) and holds the fewest (lowest
// index on ties); it moves work away from a node that refuses (overloaded) or goes down,
// sends a straggler's request again to an idle node (the first answer wins), and answers
// worker_unavailable when no node is alive. Of the requests it carries it reads only the
// chip.
// docs/dispatcher.md describes the protocol.
#pragma once

#include "cluster/dispatcher_config.hpp"
#include "messages/dispatcher_actor.hpp"

#include <vector>

namespace maxkernel::cluster {

messages::dispatcher_actor spawn_dispatcher(caf::actor_system& sys,
                                            std::vector<messages::tpu_node_actor> nodes,
                                            dispatcher_config config = {});

}  // namespace maxkernel::cluster
