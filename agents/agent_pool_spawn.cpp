#include "agents/agent_pool_spawn.hpp"

#include "agents/debugger_actor.hpp"
#include "agents/implementer_actor.hpp"
#include "agents/planner_actor.hpp"
#include "agents/profiler_actor.hpp"
#include "agents/tester_actor.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

namespace maxkernel::agents {

messages::agent_pool spawn_agent_pool(caf::actor_system& sys, const brain_chains& chains) {
  return {spawn_planner(sys, chains.planner), spawn_implementer(sys, chains.implementer),
          spawn_debugger(sys, chains.debugger), spawn_tester(sys), spawn_profiler(sys)};
}

void stop_agent_pool(const messages::agent_pool& pool) {
  for (auto a : {caf::actor_cast<caf::actor>(pool.planner),
                 caf::actor_cast<caf::actor>(pool.implementer),
                 caf::actor_cast<caf::actor>(pool.debugger), caf::actor_cast<caf::actor>(pool.tester),
                 caf::actor_cast<caf::actor>(pool.profiler)})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

}  // namespace maxkernel::agents
