// The operator gateway: the hitl supervisor's side is messages::operator_actor; the operators'
// side is a ZeroMQ ROUTER socket to which terminal shells (`maxkernel attach`) connect with a
// DEALER, one Cap'n Proto message per frame (OperatorCommand in, OperatorEvent out).
// The socket lives in a thread the actor owns (a CAF actor must not block); the thread ends
// when the actor does. docs/operator-gateway.md describes the protocol.
#pragma once

#include "messages/operator_actor.hpp"

#include <caf/expected.hpp>

#include <chrono>
#include <string>

namespace caf {
class actor_system;
}

namespace maxkernel::cluster {

struct operator_gateway_config {
  // Where shells connect: ipc:///path/sock, tcp://127.0.0.1:5555, or tcp://127.0.0.1:* (any
  // free port; the bound endpoint says which).
  std::string endpoint = "tcp://127.0.0.1:*";
  // A shell silent this long (shells ping every second) is detached.
  std::chrono::milliseconds liveness{5000};
  // Sent to each shell that attaches: the search (task, mode, chip).
  std::string welcome;
  // A cluster's credentials (docs/cluster.md): shells must come with them (CURVE). "": none.
  std::string token_file;
};

struct operator_gateway {
  messages::operator_actor handle;
  std::string endpoint;  // the bound endpoint (the real port when `*` was asked for)
};

// Binds the socket and spawns the gateway. A bind failure is a bad_input error naming the
// endpoint. The gateway stops when its last handle goes (or on an exit message); while a
// proposal waits it holds itself alive (its promise does), so send it an exit to stop it.
caf::expected<operator_gateway> spawn_operator_gateway(caf::actor_system& sys,
                                                       const operator_gateway_config& config);

}  // namespace maxkernel::cluster
