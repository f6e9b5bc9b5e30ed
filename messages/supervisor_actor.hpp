// Typed interfaces of the supervisors (actors/, docs/modes.md): one OptimizeRequest runs a
// whole search (auto, graph or hitl) and is answered with its OptimizeResult
// (messages/schema/search.capnp). While it runs the supervisor tells its listener how it is
// going; an operator may stop, pause, resume or re-budget it meanwhile (SearchControl). Errors
// arrive as caf::error with a messages::error_code: `malformed_message`, `bad_input`
// (settings it cannot act on, a graph file of another search), `internal`.
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace maxkernel::messages {

using supervisor_actor = caf::typed_actor<
  // OptimizeRequest -> OptimizeResult
  caf::replies_to<optimize_atom, payload>::with<payload>,
  // SearchControl -> Progress; `bad_input` when no search is running
  caf::replies_to<control_atom, payload>::with<payload>>;

using progress_listener_actor = caf::typed_actor<
  // Progress
  caf::reacts_to<progress_atom, payload>>;

}  // namespace maxkernel::messages
