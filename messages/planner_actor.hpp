// Typed interface of the planner (messages/schema/agent.capnp, docs/agents.md): a PlannerRequest (spec, analyze summary, history) -> a Plan, best step first.
// Errors arrive as caf::error with a messages::error_code: `malformed_message` (a payload
// that does not decode or holds another message type), `bad_input` (an unknown chip, a
// request the role cannot act on), `service_unavailable` (an LLM brain that could not be reached or whose replies never parsed).
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace maxkernel::messages {

using planner_actor = caf::typed_actor<
  // PlannerRequest -> Plan
  caf::replies_to<plan_atom, payload>::with<payload>>;

}  // namespace maxkernel::messages
