// The CAF wrapper type as a remote peer's bytes reach it: CAF 0.17's binary deserializer, as
// the middleman runs it on a BASP message, then the payload to the typed decoders by its
// type id (tests/fuzz/inbound_types). Input: one byte choosing the form (0: a bare
// maxkernel_payload; otherwise a whole caf::message, the form BASP carries), then CAF's bytes.
#include "inbound_types.hpp"
#include "messages/payload.hpp"
#include "messages/type_registry.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/message.hpp>

#include <cstddef>
#include <cstdint>

namespace {

caf::actor_system& system() {
  static caf::actor_system_config* cfg = [] {
    auto* c = new caf::actor_system_config;
    maxkernel::messages::register_types(*c);
    c->set("scheduler.max-threads", 1);
    return c;
  }();
  static caf::actor_system* sys = new caf::actor_system(*cfg);  // never torn down
  return *sys;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using maxkernel::messages::payload;
  if (size == 0)
    return 0;
  auto& sys = system();
  caf::binary_deserializer source{sys, reinterpret_cast<const char*>(data + 1), size - 1};
  if (data[0] == 0) {
    payload p;
    if (!source(p))
      maxkernel::fuzz::receive_payload(p.type_id, p.bytes);
    return 0;
  }
  caf::message msg;
  if (source(msg))
    return 0;
  for (size_t i = 0; i < msg.size(); ++i)
    if (msg.match_element<payload>(i)) {
      const auto& p = msg.get_as<payload>(i);
      maxkernel::fuzz::receive_payload(p.type_id, p.bytes);
    }
  return 0;
}
