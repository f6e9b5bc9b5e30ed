// The planner role as an actor (messages/planner_actor.hpp). Plans: the expert matches templates and ranks playbook moves from the best candidate's diagnosis; an LLM brain, when in the chain, plans from the spec, the history and the profiles.
// One implementation serves every mode; the brain chain comes from the config. Detached
// when a brain of the chain blocks on a remote service (an LLM), so that it never holds a
// scheduler thread.
#pragma once

#include "agents/brain.hpp"
#include "messages/planner_actor.hpp"

#include <vector>

namespace caf {
class actor_system;
}

namespace maxkernel::agents {

messages::planner_actor spawn_planner(caf::actor_system& sys, std::vector<planner_brain_ptr> chain);

}  // namespace maxkernel::agents
