// The hitl mode's supervisor: the auto chain (plan from the best accepted candidate ->
// implement -> evaluate -> tester's cases -> debug -> profile), but every evaluated candidate
// goes to the operator as a Proposal (plan step, kernel diff against its parent, result,
// diagnosis) through the operator gateway, and the supervisor waits for the Decision:
// approve, reject with feedback (to the planner), edit (parameters through the implementer,
// or the source), hint (accept; the text steers the next plans), take over (the operator's
// own kernel), hand over to auto for N proposals, or stop. Only accepted vertices can be the
// best or a parent. On timeout (SearchSettings.operatorTimeoutSeconds) it keeps waiting,
// approves or stops (onTimeout). Every proposal and decision goes into the transcript,
// written through with the graph: a resumed search asks again for the proposal it was
// waiting on. docs/modes.md.
#pragma once

#include "messages/agent_pool.hpp"
#include "messages/operator_actor.hpp"
#include "messages/supervisor_actor.hpp"
#include "messages/tpu_node_actor.hpp"

namespace caf {
class actor_system;
}

namespace maxkernel::actors {

// `op`: the operator gateway (or any operator_actor); `listener` may be invalid.
messages::supervisor_actor spawn_hitl_supervisor(caf::actor_system& sys,
                                                 messages::agent_pool pool,
                                                 messages::tpu_node_actor node,
                                                 messages::progress_listener_actor listener,
                                                 messages::operator_actor op);

}  // namespace maxkernel::actors
