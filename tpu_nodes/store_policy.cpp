#include "tpu_nodes/store_policy.hpp"

#include "messages/payload_codec.hpp"
#include "tpu_nodes/checked_payload.hpp"

#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <capnp/schema.h>

namespace maxkernel::tpu_nodes {

namespace {

std::string name_of(schema::ErrorClass cls) {
  KJ_IF_MAYBE (e, capnp::toDynamic(cls).getEnumerant()) {
    return e->getProto().getName();
  }
  return std::to_string(static_cast<unsigned>(cls));
}

}  // namespace

bool recordable(schema::EvalResult::Reader result) {
  for (auto p : result.getPhases()) {
    switch (p.getErrorClass()) {
      case schema::ErrorClass::TIMEOUT:
      case schema::ErrorClass::INTERNAL:
      case schema::ErrorClass::OVERLOADED:
      case schema::ErrorClass::BAD_INPUT:
      case schema::ErrorClass::TOO_LARGE:
        return false;
      default:
        break;
    }
  }
  return true;
}

std::string failure_class(schema::EvalResult::Reader result) {
  for (auto p : result.getPhases())
    if (p.getStatus() == schema::Status::FAILED)
      return name_of(p.getErrorClass());
  return {};
}

search::evaluation_record record_for(const std::string& key, const std::string& result_bytes,
                                     schema::EvalResult::Reader result,
                                     const std::string& spec_name, const std::string& chip) {
  search::evaluation_record record;
  record.key = key;
  record.result = result_bytes;
  record.spec_name = spec_name;
  record.chip = chip;
  record.backend = result.getBackend();
  record.correct = result.getCorrect();
  record.time_us = result.getHasProfile() ? result.getProfile().getTimeUs() : 0;
  record.error_class = failure_class(result);
  return record;
}

messages::payload stamped_result(const std::string& result_bytes, const std::string& key,
                                 bool cached, const std::string& candidate_id,
                                 std::string& error) {
  auto decoded = open_checked<schema::EvalResult>(result_bytes, error);
  if (!decoded)
    return {};
  capnp::MallocMessageBuilder msg;
  msg.setRoot(decoded->root<schema::EvalResult>());
  auto r = msg.getRoot<schema::EvalResult>();
  r.setKey(key);
  r.setCached(cached);
  if (!candidate_id.empty())
    r.setCandidateId(candidate_id);
  return messages::make_payload<schema::EvalResult>(msg);
}

}  // namespace maxkernel::tpu_nodes
