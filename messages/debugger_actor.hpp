// Typed interface of the debugger (messages/schema/agent.capnp, docs/agents.md): a DebugRequest (candidate, failed EvalResult) -> a DebugReply: a repaired candidate, or a reason to give up.
// Errors arrive as caf::error with a messages::error_code: `malformed_message` (a payload
// that does not decode or holds another message type), `bad_input` (an unknown chip, a
// request the role cannot act on), `service_unavailable` (an LLM brain that could not be reached).
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace maxkernel::messages {

using debugger_actor = caf::typed_actor<
  // DebugRequest -> DebugReply
  caf::replies_to<debug_atom, payload>::with<payload>>;

}  // namespace maxkernel::messages
