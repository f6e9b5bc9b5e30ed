// The profiler role as an actor (messages/profiler_actor.hpp): decodes a ProfilerRequest,
// loads the chip it names (config::load_chip) and answers agents::diagnose's Diagnosis.
// Stateless: one instance serves every mode.
#pragma once

#include "messages/profiler_actor.hpp"

namespace caf {
class actor_system;
}

namespace maxkernel::agents {

messages::profiler_actor spawn_profiler(caf::actor_system& sys);

}  // namespace maxkernel::agents
