// The debugger role as an actor (messages/debugger_actor.hpp). Repairs a failed candidate (expert repair rules by error class, then an LLM if configured), or gives up with a reason.
// One implementation serves every mode; the brain chain comes from the config. Detached
// when a brain of the chain blocks on a remote service (an LLM), so that it never holds a
// scheduler thread.
#pragma once

#include "agents/brain.hpp"
#include "messages/debugger_actor.hpp"

#include <vector>

namespace caf {
class actor_system;
}

namespace maxkernel::agents {

messages::debugger_actor spawn_debugger(caf::actor_system& sys, std::vector<debugger_brain_ptr> chain);

}  // namespace maxkernel::agents
