#include "agents/implementer_actor.hpp"

#include "agents/role_chain.hpp"

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>

namespace maxkernel::agents {
namespace {

using messages::payload;

messages::implementer_actor::behavior_type implementer(std::vector<implementer_brain_ptr> chain) {
  return {
    [chain](messages::implement_atom, const payload& request) -> caf::result<payload> {
      auto r = run_implementers(chain, request);
      if (auto* p = std::get_if<payload>(&r))
        return std::move(*p);
      return std::get<caf::error>(std::move(r));
    },
  };
}

}  // namespace

messages::implementer_actor spawn_implementer(caf::actor_system& sys, std::vector<implementer_brain_ptr> chain) {
  bool blocking = std::any_of(chain.begin(), chain.end(),
                              [](const implementer_brain_ptr& b) { return b->name() != "expert"; });
  if (blocking)
    return sys.spawn<caf::detached>(implementer, std::move(chain));
  return sys.spawn(implementer, std::move(chain));
}

}  // namespace maxkernel::agents
