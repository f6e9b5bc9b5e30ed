// An event from a cluster's supervisor on its client port (cli/cluster_client), read as the
// client reads it: its own file so that the fuzz target (tests/fuzz) runs the same checks.
#pragma once

#include "maxkernel/schema/submission.capnp.h"
#include "messages/capnp_io.hpp"

#include <optional>
#include <string>

namespace maxkernel::cli {

// The event, every pointer of it checked and its schema version ours; nullopt with `error`.
std::optional<messages::decoded_message> read_client_event(const std::string& bytes,
                                                           std::string& error);

}  // namespace maxkernel::cli
