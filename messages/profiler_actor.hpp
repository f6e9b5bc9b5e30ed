// Typed interface of the profiler: a ProfilerRequest (Profile, the candidate's
// KernelStructure, the chip's name) -> a Diagnosis (messages/schema/agent.capnp). Errors
// arrive as caf::error with a messages::error_code: `bad_input` (unknown chip),
// `malformed_message` (a payload that does not decode or holds another message type).
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace maxkernel::messages {

using profiler_actor = caf::typed_actor<
  // ProfilerRequest -> Diagnosis
  caf::replies_to<diagnose_atom, payload>::with<payload>>;

}  // namespace maxkernel::messages
