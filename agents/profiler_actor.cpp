#include "agents/profiler_actor.hpp"

#include "agents/diagnosis.hpp"
#include "config/chip_loader.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <kj/exception.h>

#include <string>

namespace maxkernel::agents {
namespace {

using messages::error_code;
using messages::make_error;
using messages::payload;

caf::result<payload> answer(const payload& request) {
  std::string err;
  auto msg = messages::open_payload<schema::ProfilerRequest>(request, err);
  if (!msg)
    return make_error(error_code::malformed_message, "ProfilerRequest: " + err);
  auto req = msg->root<schema::ProfilerRequest>();
  config::chip chip;
  config::spec_error chip_err;
  if (!config::load_chip(req.getChip().cStr(), chip, chip_err))
    return make_error(error_code::bad_input, "ProfilerRequest.chip: " + chip_err.what());
  try {
    capnp::MallocMessageBuilder out;
    diagnose(req, chip, out.initRoot<schema::Diagnosis>());
    return messages::make_payload<schema::Diagnosis>(out);
  } catch (const kj::Exception& e) {
    // A well-formed message with contents capnp still refuses (a text that is not text).
    return make_error(error_code::malformed_message,
                      std::string("ProfilerRequest: ") + e.getDescription().cStr());
  }
}

messages::profiler_actor::behavior_type profiler() {
  return {
    [](messages::diagnose_atom, const payload& request) -> caf::result<payload> {
      return answer(request);
    },
  };
}

}  // namespace

messages::profiler_actor spawn_profiler(caf::actor_system& sys) {
  return sys.spawn(profiler);
}

}  // namespace maxkernel::agents
