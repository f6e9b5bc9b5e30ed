// Typed interface of the operator gateway (cluster/operator_gateway.hpp), the hitl
// supervisor's way to its human operators (messages/schema/operator.capnp, docs/modes.md).
// A Proposal is answered with the Decision of the first attached shell that decides it; with
// no shell attached it waits (the supervisor's timeout policy applies: it sends the decision
// it took itself as a `decided` notice, which withdraws the proposal from the shells).
// Errors as caf::error with a messages::error_code: `malformed_message`, `bad_input` (a
// second proposal while one waits).
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>

namespace maxkernel::messages {

using operator_actor = caf::typed_actor<
  // Proposal -> Decision
  caf::replies_to<propose_atom, payload>::with<payload>,
  // OperatorEvent to every attached shell (notice, decided, ended)
  caf::reacts_to<notify_atom, payload>,
  // -> the number of shells attached
  caf::replies_to<status_atom>::with<uint32_t>>;

}  // namespace maxkernel::messages
