#include "agents/debugger_actor.hpp"

#include "agents/role_chain.hpp"

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>

namespace maxkernel::agents {
namespace {

using messages::payload;

messages::debugger_actor::behavior_type debugger(std::vector<debugger_brain_ptr> chain) {
  return {
    [chain](messages::debug_atom, const payload& request) -> caf::result<payload> {
      auto r = run_debuggers(chain, request);
      if (auto* p = std::get_if<payload>(&r))
        return std::move(*p);
      return std::get<caf::error>(std::move(r));
    },
  };
}

}  // namespace

messages::debugger_actor spawn_debugger(caf::actor_system& sys, std::vector<debugger_brain_ptr> chain) {
  bool blocking = std::any_of(chain.begin(), chain.end(),
                              [](const debugger_brain_ptr& b) { return b->name() != "expert"; });
  if (blocking)
    return sys.spawn<caf::detached>(debugger, std::move(chain));
  return sys.spawn(debugger, std::move(chain));
}

}  // namespace maxkernel::agents
