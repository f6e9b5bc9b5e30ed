// One evaluation through the command's tpu_node, decoded.
#pragma once

#include "messages/eval_request.hpp"
#include "cli/node_session.hpp"
#include "messages/capnp_io.hpp"

#include <optional>
#include <string>

namespace maxkernel::cli {

struct evaluated {
  std::optional<messages::decoded_message> message;
  int exit_code = 0;  // 0, else 2 (bad input) or 3 (environment) and `error`
  std::string error;
  schema::EvalResult::Reader result() { return message->root<schema::EvalResult>(); }
};

evaluated evaluate(node_session& session, schema::KernelSpec::Reader spec,
                   const std::string& source, const std::string& origin,
                   const messages::request_settings& settings);

// Why an evaluation has no profile, from its failed phase.
std::string failure_of(schema::EvalResult::Reader result);

}  // namespace maxkernel::cli
