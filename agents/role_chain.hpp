// How a role actor runs its brain chain (config: `planner: [expert, llm]`): each brain in
// turn until one has an answer (a plan with steps, a candidate, a repair); a brain that fails
// or has nothing hands over to the next. Usage of every brain tried is summed into the reply.
// Internal to the role actors (CAF-free; the actors wrap it).
#pragma once

#include "agents/brain.hpp"
#include "messages/payload.hpp"

#include <caf/error.hpp>

#include <variant>
#include <vector>

namespace maxkernel::agents {

// payload(PlannerRequest) -> payload(Plan) or an error.
std::variant<messages::payload, caf::error> run_planners(
  const std::vector<planner_brain_ptr>& chain, const messages::payload& request);
// payload(ImplementRequest) -> payload(ImplementReply); the step's `brain` is asked first.
std::variant<messages::payload, caf::error> run_implementers(
  const std::vector<implementer_brain_ptr>& chain, const messages::payload& request);
// payload(DebugRequest) -> payload(DebugReply).
std::variant<messages::payload, caf::error> run_debuggers(
  const std::vector<debugger_brain_ptr>& chain, const messages::payload& request);

void add_usage(schema::Usage::Builder into, schema::Usage::Reader more);

}  // namespace maxkernel::agents
