// Typed interface of a TPU node (one device): it evaluates candidates and describes itself.
// Every argument and result is a Cap'n Proto payload, so the interface is the same in
// process and across hosts.
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace maxkernel::messages {

using tpu_node_actor = caf::typed_actor<
  // EvalRequest -> EvalResult
  caf::replies_to<evaluate_atom, payload>::with<payload>,
  // path of a task directory -> KernelSpec
  caf::replies_to<load_atom, std::string>::with<payload>,
  // AnalyzeRequest -> DataflowGraph
  caf::replies_to<analyze_atom, payload>::with<payload>,
  // -> NodeInfo
  caf::replies_to<info_atom>::with<payload>>;

}  // namespace maxkernel::messages
