#include "agents/tester_actor.hpp"

#include "agents/tester.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <kj/exception.h>

#include <string>

namespace maxkernel::agents {
namespace {

using messages::error_code;
using messages::make_error;
using messages::payload;

// Decodes a Request, runs `brain` into a fresh Answer and returns it as a payload; the
// brain's refusals are bad_input, undecodable payloads malformed_message.
template <class Request, class Answer, class Brain>
caf::result<payload> answer(const payload& request, const char* what, Brain brain) {
  std::string err;
  auto msg = messages::open_payload<Request>(request, err);
  if (!msg)
    return make_error(error_code::malformed_message, std::string(what) + ": " + err);
  msg->allow_rereading();  // walked whole when decoded; the rules read the spec many times
  try {
    capnp::MallocMessageBuilder out;
    if (!brain(msg->template root<Request>(), out.initRoot<Answer>(), err))
      return make_error(error_code::bad_input, err);
    return messages::make_payload<Answer>(out);
  } catch (const kj::Exception& e) {
    // A well-formed message with contents capnp still refuses (a text that is not text).
    return make_error(error_code::malformed_message,
                      std::string(what) + ": " + e.getDescription().cStr());
  }
}

messages::tester_actor::behavior_type tester() {
  return {
    [](messages::testplan_atom, const payload& request) -> caf::result<payload> {
      return answer<schema::TesterRequest, schema::TestPlan>(
        request, "TesterRequest",
        [](schema::TesterRequest::Reader r, schema::TestPlan::Builder b, std::string& e) {
          return choose_tests(r, b, e);
        });
    },
    [](messages::judge_atom, const payload& request) -> caf::result<payload> {
      return answer<schema::JudgeRequest, schema::Verdict>(
        request, "JudgeRequest",
        [](schema::JudgeRequest::Reader r, schema::Verdict::Builder b, std::string& e) {
          return judge(r, b, e);
        });
    },
  };
}

}  // namespace

messages::tester_actor spawn_tester(caf::actor_system& sys) {
  return sys.spawn(tester);
}

}  // namespace maxkernel::agents
