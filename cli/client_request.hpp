// A request on a cluster's client port (cli/submission_server), read and checked as the
// supervisor reads it, before anything is written or run: its own file so that the fuzz
// target (tests/fuzz) runs the server's own checks without a session.
#pragma once

#include "maxkernel/schema/submission.capnp.h"
#include "messages/capnp_io.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace maxkernel::cli {

// The most a submission's files may hold.
constexpr uint64_t max_task_bytes = 256ull << 20;

// The request, every pointer of it checked; nullopt with `why` (the text the client is
// refused with) for bytes that are no message of this schema version.
std::optional<messages::decoded_message> read_client_request(const std::string& bytes,
                                                             std::string& why);

// A submission the server can run: the optimize command, a spec name without '/', files
// inside the task, at most max_task_bytes. False with `why`.
bool check_submission(schema::Submission::Reader sub, std::string& why);

}  // namespace maxkernel::cli
