#include "agents/planner_actor.hpp"

#include "agents/role_actor.hpp"
#include "agents/role_chain.hpp"

namespace maxkernel::agents {

messages::planner_actor spawn_planner(caf::actor_system& sys, std::vector<planner_brain_ptr> chain) {
  return spawn_role<messages::planner_actor, messages::plan_atom>(sys, std::move(chain), &run_planners);
}

}  // namespace maxkernel::agents
