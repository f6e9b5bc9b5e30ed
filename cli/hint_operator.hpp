// A scripted operator for hitl searches without a human (`bench --modes hitl-hint`): it
// answers each proposal at once with a hint carrying the profiler's top suggestion for the
// proposed kernel (the most a diligent operator does without writing code), and approves
// proposals without a diagnosis. It measures what the hitl channel adds over auto when the
// operator only relays the profiler.
#pragma once

#include "messages/operator_actor.hpp"

namespace caf {
class actor_system;
}

namespace maxkernel::cli {

messages::operator_actor spawn_hint_operator(caf::actor_system& sys);

}  // namespace maxkernel::cli
