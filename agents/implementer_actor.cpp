#include "agents/implementer_actor.hpp"

#include "agents/role_actor.hpp"
#include "agents/role_chain.hpp"

namespace maxkernel::agents {

messages::implementer_actor spawn_implementer(caf::actor_system& sys, std::vector<implementer_brain_ptr> chain) {
  return spawn_role<messages::implementer_actor, messages::implement_atom>(sys, std::move(chain), &run_implementers);
}

}  // namespace maxkernel::agents
