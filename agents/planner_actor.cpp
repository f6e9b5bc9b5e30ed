#include "agents/planner_actor.hpp"

#include "agents/role_chain.hpp"

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>

namespace maxkernel::agents {
namespace {

using messages::payload;

messages::planner_actor::behavior_type planner(std::vector<planner_brain_ptr> chain) {
  return {
    [chain](messages::plan_atom, const payload& request) -> caf::result<payload> {
      auto r = run_planners(chain, request);
      if (auto* p = std::get_if<payload>(&r))
        return std::move(*p);
      return std::get<caf::error>(std::move(r));
    },
  };
}

}  // namespace

messages::planner_actor spawn_planner(caf::actor_system& sys, std::vector<planner_brain_ptr> chain) {
  bool blocking = std::any_of(chain.begin(), chain.end(),
                              [](const planner_brain_ptr& b) { return b->name() != "expert"; });
  if (blocking)
    return sys.spawn<caf::detached>(planner, std::move(chain));
  return sys.spawn(planner, std::move(chain));
}

}  // namespace maxkernel::agents
