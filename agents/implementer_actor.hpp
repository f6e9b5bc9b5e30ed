// The implementer role as an actor (messages/implementer_actor.hpp). Turns a plan step and its parent into a new Candidate (a rendered template, or an LLM's kernel).
// One implementation serves every mode; the brain chain comes from the config. Detached
// when a brain of the chain blocks on a remote service (an LLM), so that it never holds a
// scheduler thread.
#pragma once

#include "agents/brain.hpp"
#include "messages/implementer_actor.hpp"

#include <vector>

namespace caf {
class actor_system;
}

namespace maxkernel::agents {

messages::implementer_actor spawn_implementer(caf::actor_system& sys, std::vector<implementer_brain_ptr> chain);

}  // namespace maxkernel::agents
