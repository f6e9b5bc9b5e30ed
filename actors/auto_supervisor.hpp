// The auto mode's supervisor: one trajectory driven by metrics and the profiler's reading.
// plan (from the best correct candidate and its diagnosis) -> implement -> evaluate on any
// free node -> tester's cases -> debug (up to maxRepairs) -> profile -> the next plan.
// Keeps the best correct candidate; stops on the evaluation or time budget, after
// `patience` candidates without a faster one, on reaching the target fraction of roofline,
// or when the planner has nothing new. docs/modes.md.
#pragma once

#include "messages/agent_pool.hpp"
#include "messages/supervisor_actor.hpp"
#include "messages/tpu_node_actor.hpp"

namespace caf {
class actor_system;
}

namespace maxkernel::actors {

// `node`: a tpu_node or the dispatcher; `listener` may be invalid (no progress reports).
messages::supervisor_actor spawn_auto_supervisor(caf::actor_system& sys,
                                                 messages::agent_pool pool,
                                                 messages::tpu_node_actor node,
                                                 messages::progress_listener_actor listener);

}  // namespace maxkernel::actors
