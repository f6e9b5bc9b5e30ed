// The live progress of a search on stderr: on a terminal one line rewritten in place
// (candidates evaluated of the budget, best speedup so far, nodes busy (from the dispatcher's
// status) or evaluations in flight, elapsed time), elsewhere one line per event (logs stay
// readable).
#pragma once

#include "messages/dispatcher_actor.hpp"
#include "messages/supervisor_actor.hpp"

#include <ostream>

namespace caf {
class actor_system;
}

namespace maxkernel::cli {

// `dispatcher` may be invalid (then the line shows evaluations in flight).
messages::progress_listener_actor spawn_progress_line(caf::actor_system& sys, std::ostream& out,
                                                      unsigned budget_evals,
                                                      messages::dispatcher_actor dispatcher);
// Ends the rewritten line (a newline on a terminal; nothing otherwise).
void end_progress_line(std::ostream& out);

}  // namespace maxkernel::cli
