// Typed interface of the implementer (messages/schema/agent.capnp, docs/agents.md): an ImplementRequest (spec, plan step, parent candidate) -> an ImplementReply holding the new Candidate.
// Errors arrive as caf::error with a messages::error_code: `malformed_message` (a payload
// that does not decode or holds another message type), `bad_input` (an unknown chip, a
// request the role cannot act on), `service_unavailable` (an LLM brain that could not be reached).
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace maxkernel::messages {

using implementer_actor = caf::typed_actor<
  // ImplementRequest -> ImplementReply
  caf::replies_to<implement_atom, payload>::with<payload>>;

}  // namespace maxkernel::messages
