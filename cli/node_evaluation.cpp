#include "cli/node_evaluation.hpp"

#include <capnp/message.h>

namespace maxkernel::cli {

evaluated evaluate(node_session& session, schema::KernelSpec::Reader spec,
                   const std::string& source, const std::string& origin,
                   const messages::request_settings& settings) {
  capnp::MallocMessageBuilder msg;
  messages::build_eval_request(msg.initRoot<schema::EvalRequest>(), spec, source, origin, settings);
  evaluated out;
  auto answer = session.evaluate(messages::encode(msg));
  if (answer.exit_code != 0) {
    out.exit_code = answer.exit_code;
    out.error = answer.error;
    return out;
  }
  out.message = messages::decode<schema::EvalResult>(answer.bytes, out.error);
  if (!out.message) {
    out.exit_code = 3;
    out.error = "the TPU node sent a bad result: " + out.error;
  }
  return out;
}

std::string failure_of(schema::EvalResult::Reader r) {
  for (auto p : r.getPhases())
    if (p.getStatus() == schema::Status::FAILED)
      return p.getMessage().cStr();
  return "no profile";
}

}  // namespace maxkernel::cli
