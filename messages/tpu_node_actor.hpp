// Typed interface of a TPU node (one device): it evaluates candidates and describes itself.
// Every argument and result is a Cap'n Proto payload, so the interface is the same in
// process and across hosts. Errors arrive as caf::error with a messages::error_code:
// `overloaded` (the node's queue is full: go elsewhere), `worker_timeout` (the deadline
// passed), `bad_input`, `worker_unavailable`, `malformed_message`, `internal`.
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>

namespace maxkernel::messages {

using tpu_node_actor = caf::typed_actor<
  // EvalRequest -> EvalResult, within the node's default deadline
  caf::replies_to<evaluate_atom, payload>::with<payload>,
  // EvalRequest, deadline in ms (0: the node's default) -> EvalResult
  caf::replies_to<evaluate_atom, payload, uint32_t>::with<payload>,
  // path of a task directory -> KernelSpec
  caf::replies_to<load_atom, std::string>::with<payload>,
  // LoadRequest (worker.capnp): a task directory's path and its files, for a node that does
  // not share the requester's disk -> KernelSpec whose paths are the requester's
  caf::replies_to<load_atom, payload>::with<payload>,
  // AnalyzeRequest -> DataflowGraph
  caf::replies_to<analyze_atom, payload>::with<payload>,
  // -> NodeInfo
  caf::replies_to<info_atom>::with<payload>>;

}  // namespace maxkernel::messages
