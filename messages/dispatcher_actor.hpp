// Typed interface of the dispatcher (cluster/dispatcher.hpp): a tpu_node to its clients (the
// supervisors send it evaluations as they would to one node) in front of every node of the
// cluster. It queues requests, sends each to a node with a free credit, moves work away
// from a node that refuses or goes down, and sends a straggler's request again to an idle
// node (the first answer wins). Errors as a tpu_node's.
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"
#include "messages/tpu_node_actor.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace maxkernel::messages {

using dispatcher_actor = tpu_node_actor::extend<
  // -> DispatcherStatus (messages/schema/cluster.capnp)
  caf::replies_to<status_atom>::with<payload>,
  // a node (a tpu_node_actor handle) joins; it gets work from the next dispatch on; it
  // takes requests for any chip
  caf::reacts_to<join_atom, caf::actor>,
  // the same with its NodeInfo (node_info.capnp): its chip and backend decide which
  // requests it gets (a jax-tpu node those for its chip, a model node any)
  caf::reacts_to<join_atom, caf::actor, payload>,
  // drain node INDEX (as in the status): it finishes what it holds and gets no more work;
  // false when there is no such node
  caf::replies_to<drain_atom, uint32_t>::with<bool>>;

}  // namespace maxkernel::messages
