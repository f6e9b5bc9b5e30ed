// Starts the sub-agent pool: one actor per role with its configured brain chain. Every mode
// (propose, auto, graph, hitl) gets the same pool.
#pragma once

#include "agents/brain_chains.hpp"
#include "messages/agent_pool.hpp"

namespace caf {
class actor_system;
}

namespace maxkernel::agents {

messages::agent_pool spawn_agent_pool(caf::actor_system& sys, const brain_chains& chains);
// Stops every role of the pool.
void stop_agent_pool(const messages::agent_pool& pool);

}  // namespace maxkernel::agents
