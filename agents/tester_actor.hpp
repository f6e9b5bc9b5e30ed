// The tester role as an actor (messages/tester_actor.hpp): decodes a TesterRequest and
// answers agents::choose_tests's TestPlan, or a JudgeRequest and answers agents::judge's
// Verdict. Stateless: one instance serves every mode.
#pragma once

#include "messages/tester_actor.hpp"

namespace caf {
class actor_system;
}

namespace maxkernel::agents {

messages::tester_actor spawn_tester(caf::actor_system& sys);

}  // namespace maxkernel::agents
