// The live progress of a search on stderr: on a terminal one line rewritten in place
// (candidates evaluated of the budget, best speedup so far, evaluations in flight at the
// nodes, elapsed time), elsewhere one line per event (logs stay readable).
#pragma once

#include "messages/supervisor_actor.hpp"

#include <ostream>

namespace caf {
class actor_system;
}

namespace maxkernel::cli {

messages::progress_listener_actor spawn_progress_line(caf::actor_system& sys, std::ostream& out,
                                                      unsigned budget_evals);
// Ends the rewritten line (a newline on a terminal; nothing otherwise).
void end_progress_line(std::ostream& out);

}  // namespace maxkernel::cli
