#include "agents/debugger_actor.hpp"

#include "agents/role_actor.hpp"
#include "agents/role_chain.hpp"

namespace maxkernel::agents {

messages::debugger_actor spawn_debugger(caf::actor_system& sys, std::vector<debugger_brain_ptr> chain) {
  return spawn_role<messages::debugger_actor, messages::debug_atom>(sys, std::move(chain), &run_debuggers);
}

}  // namespace maxkernel::agents
