// What the planner, implementer and debugger actors share: a stateless behavior answering
// one atom with the role's brain chain (role_chain.hpp), spawned detached when a brain of the
// chain blocks on a remote service (anything but the expert brain), so it never holds a
// scheduler thread. Included only by those actors' .cpp files (it pulls in CAF).
#pragma once

#include "messages/payload.hpp"

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <memory>
#include <variant>
#include <vector>

namespace maxkernel::agents {

template <class Handle, class Atom, class Brain, class Run>
Handle spawn_role(caf::actor_system& sys, std::vector<std::shared_ptr<Brain>> chain, Run run) {
  auto behavior = [](std::vector<std::shared_ptr<Brain>> brains,
                     Run answer) -> typename Handle::behavior_type {
    return {
      [brains, answer](Atom, const messages::payload& request)
        -> caf::result<messages::payload> {
        auto r = answer(brains, request);
        if (auto* p = std::get_if<messages::payload>(&r))
          return std::move(*p);
        return std::get<caf::error>(std::move(r));
      },
    };
  };
  bool blocking = std::any_of(chain.begin(), chain.end(),
                              [](const auto& b) { return b->name() != "expert"; });
  if (blocking)
    return sys.spawn<caf::detached>(behavior, std::move(chain), run);
  return sys.spawn(behavior, std::move(chain), run);
}

}  // namespace maxkernel::agents
