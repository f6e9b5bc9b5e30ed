// Typed interface of the tester (messages/schema/agent.capnp, docs/agents.md): a TesterRequest -> the TestPlan (cases to evaluate), and a JudgeRequest (the plan and its results) -> a Verdict.
// Errors arrive as caf::error with a messages::error_code: `malformed_message` (a payload
// that does not decode or holds another message type), `bad_input` (an unknown chip, a
// request the role cannot act on).
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace maxkernel::messages {

using tester_actor = caf::typed_actor<
  // TesterRequest -> TestPlan
  caf::replies_to<testplan_atom, payload>::with<payload>,
  // JudgeRequest -> Verdict
  caf::replies_to<judge_atom, payload>::with<payload>>;

}  // namespace maxkernel::messages
