#include "messages/type_registry.hpp"

#include "messages/error.hpp"
#include "messages/payload.hpp"

#include <caf/actor_system_config.hpp>

namespace maxkernel::messages {

void register_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<payload>("maxkernel_payload");
  cfg.add_error_category(error_category, [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    std::string out = "maxkernel::";
    out += to_string(static_cast<error_code>(code));
    if (ctx.match_elements<std::string>()) {
      out += ": ";
      out += ctx.get_as<std::string>(0);
    }
    return out;
  });
}

}  // namespace maxkernel::messages
