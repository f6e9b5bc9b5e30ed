// The graph mode's supervisor: a global search over a graph of candidates. Each round selects
// frontier vertices (search/selection_policy: beam, or a bandit with a diversity term), asks
// the planner for `branching` moves from each, has them implemented, and fans every child's
// lineage (evaluation, the tester's cases, repairs, profile) out at once to the node or the
// dispatcher in front of all nodes. A round's children are fixed (and written to the graph
// file as pending) before any is dispatched, and the next selection reads the round's
// results in vertex order: for a given spec, seed and budget the outcome does not depend on
// the number of nodes, the order answers arrive in, or node failures. docs/modes.md.
#pragma once

#include "messages/agent_pool.hpp"
#include "messages/supervisor_actor.hpp"
#include "messages/tpu_node_actor.hpp"

namespace caf {
class actor_system;
}

namespace maxkernel::actors {

messages::supervisor_actor spawn_graph_supervisor(caf::actor_system& sys,
                                                  messages::agent_pool pool,
                                                  messages::tpu_node_actor node,
                                                  messages::progress_listener_actor listener);

}  // namespace maxkernel::actors
