// Registers the project's message types and error category with an actor system config.
// Every process must call it: an unregistered type fails to (de)serialize across hosts.
#pragma once

namespace caf {
class actor_system_config;
}

namespace maxkernel::messages {

void register_types(caf::actor_system_config& cfg);

}  // namespace maxkernel::messages
