#include "messages/eval_failure.hpp"

#include "messages/capnp_io.hpp"

#include <capnp/message.h>
#include <capnp/schema.h>

namespace maxkernel::messages {

std::string error_class_name(schema::ErrorClass cls) {
  auto e = capnp::Schema::from<schema::ErrorClass>().getEnumerants();
  auto i = static_cast<unsigned>(cls);
  return i < e.size() ? std::string(e[i].getProto().getName().cStr()) : "unknown";
}

std::string failure_class(schema::EvalResult::Reader result) {
  for (auto p : result.getPhases())
    if (p.getStatus() == schema::Status::FAILED)
      return error_class_name(p.getErrorClass());
  return result.getCorrect() ? "none" : "mismatch";
}

std::string failure_message(schema::EvalResult::Reader result) {
  for (auto p : result.getPhases())
    if (p.getStatus() == schema::Status::FAILED)
      return p.getMessage().cStr();
  return "";
}

std::string timeout_result(const std::string& why) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::EvalResult>();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  auto phase = r.initPhases(1)[0];
  phase.setPhase(schema::Phase::TEST);
  phase.setStatus(schema::Status::FAILED);
  phase.setErrorClass(schema::ErrorClass::TIMEOUT);
  phase.setMessage(why);
  return encode(msg);
}

}  // namespace maxkernel::messages
