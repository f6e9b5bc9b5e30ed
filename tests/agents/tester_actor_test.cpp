// The tester's protocol under CAF's deterministic scheduler: a TesterRequest is answered with
// the TestPlan and a JudgeRequest with the Verdict; requests the role cannot act on (a spec
// without configurations, results that do not answer the plan) with bad_input; payloads
// that do not decode, hold another message or another schema version with
// malformed_message; the actor survives each.
#include "agents/tester.hpp"
#include "agents/tester_actor.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "tests/agents/tester_requests.hpp"
#include "tests/support/deterministic_system.hpp"

#include <caf/exit_reason.hpp>
#include <gtest/gtest.h>

#include <optional>

using namespace maxkernel;
using messages::error_code;
using messages::payload;

namespace {

struct reply {
  bool arrived = false;
  std::optional<payload> value;
  caf::error error;
};

class TesterActor : public ::testing::Test {
protected:
  void TearDown() override {
    env.self->send_exit(tester, caf::exit_reason::user_shutdown);
    env.run_messages();
  }

  template <class Atom>
  reply ask(Atom atom, const payload& p) {
    env.self->send(tester, atom, p);
    env.run_messages();
    reply r;
    r.arrived = env.receive_now([&](payload& v) { r.value = std::move(v); },
                                [&](caf::error& e) { r.error = std::move(e); });
    return r;
  }

  static payload plan_request(uint64_t seed) {
    capnp::MallocMessageBuilder msg;
    tests::fill_tester_request(msg.initRoot<schema::TesterRequest>(),
                               tests::matmul_desc(512, 256, 512, "bfloat16", 2e-2), seed, false);
    return messages::make_payload<schema::TesterRequest>(msg);
  }

  static payload judge_request(std::vector<std::string> names,
                               std::vector<tests::result_desc> results) {
    capnp::MallocMessageBuilder msg;
    tests::fill_judge_request(msg.initRoot<schema::JudgeRequest>(),
                              tests::matmul_desc(256, 256, 256, "float32", 2e-2), names, results);
    return messages::make_payload<schema::JudgeRequest>(msg);
  }

  test_support::deterministic_system env;
  messages::tester_actor tester = agents::spawn_tester(env.sys);
};

TEST_F(TesterActor, AnswersATesterRequestWithThePlan) {
  auto r = ask(messages::testplan_atom::value, plan_request(3));
  ASSERT_TRUE(r.arrived);
  ASSERT_TRUE(r.value) << messages::message_of(r.error);
  std::string err;
  auto msg = messages::open_payload<schema::TestPlan>(*r.value, err);
  ASSERT_TRUE(msg) << err;
  auto plan = msg->root<schema::TestPlan>();
  ASSERT_EQ(plan.getCases().size(), 4u);
  EXPECT_EQ(plan.getCases()[0].getName(), "fresh inputs");
  EXPECT_EQ(plan.getCases()[0].getOptions().getSeeds()[0], agents::case_seed(3, 0));
  EXPECT_EQ(plan.getCases()[1].getOptions().getShapeMode(), "ragged");
  EXPECT_EQ(plan.getCases()[2].getOptions().getValueMode(), "large");
  EXPECT_EQ(plan.getCases()[3].getOptions().getValueMode(), "zeros");
}

TEST_F(TesterActor, AnswersAJudgeRequestWithTheVerdict) {
  auto r = ask(messages::judge_atom::value,
               judge_request({"fresh inputs", "zeros"},
                             {tests::passed_result(0.001, 0.001),
                              tests::failed_result(schema::ErrorClass::NON_FINITE, "NaN",
                                                   {{false, 0, 0, 0}})}));
  ASSERT_TRUE(r.arrived);
  ASSERT_TRUE(r.value) << messages::message_of(r.error);
  std::string err;
  auto msg = messages::open_payload<schema::Verdict>(*r.value, err);
  ASSERT_TRUE(msg) << err;
  auto v = msg->root<schema::Verdict>();
  EXPECT_FALSE(v.getCorrect());
  EXPECT_EQ(v.getFailedCase(), 1);
  EXPECT_NE(std::string(v.getSummary()).find("case 1 (zeros) failed: test nonFinite"),
            std::string::npos) << v.getSummary().cStr();
}

TEST_F(TesterActor, RequestsTheRoleCannotActOnAreBadInput) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::TesterRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.initSpec().setName("no configurations");
  auto r = ask(messages::testplan_atom::value, messages::make_payload<schema::TesterRequest>(msg));
  ASSERT_TRUE(r.arrived);
  ASSERT_FALSE(r.value);
  EXPECT_EQ(messages::code_of(r.error), error_code::bad_input);
  EXPECT_NE(messages::message_of(r.error).find("no configurations"), std::string::npos);

  auto j = ask(messages::judge_atom::value,
               judge_request({"fresh inputs", "zeros"}, {tests::passed_result(0, 0)}));
  ASSERT_TRUE(j.arrived);
  EXPECT_EQ(messages::code_of(j.error), error_code::bad_input);
  EXPECT_NE(messages::message_of(j.error).find("1 result for 2 plan cases"), std::string::npos)
      << messages::message_of(j.error);

  // The actor still serves.
  EXPECT_TRUE(ask(messages::testplan_atom::value, plan_request(1)).value);
}

TEST_F(TesterActor, MalformedPayloadsAreErrorsNotCrashes) {
  payload garbage{capnp::typeId<schema::TesterRequest>(), "not a capnp message at all"};
  auto r = ask(messages::testplan_atom::value, garbage);
  ASSERT_TRUE(r.arrived);
  ASSERT_FALSE(r.value);
  EXPECT_EQ(messages::code_of(r.error), error_code::malformed_message);

  // A TesterRequest sent for judging: another message type.
  auto wrong = ask(messages::judge_atom::value, plan_request(1));
  ASSERT_TRUE(wrong.arrived);
  EXPECT_EQ(messages::code_of(wrong.error), error_code::malformed_message);
  EXPECT_NE(messages::message_of(wrong.error).find("JudgeRequest"), std::string::npos);

  // A request from another schema version.
  capnp::MallocMessageBuilder old;
  old.initRoot<schema::JudgeRequest>();  // schemaVersion 0
  auto versioned = ask(messages::judge_atom::value, messages::make_payload<schema::JudgeRequest>(old));
  ASSERT_TRUE(versioned.arrived);
  EXPECT_EQ(messages::code_of(versioned.error), error_code::malformed_message);

  EXPECT_TRUE(ask(messages::judge_atom::value,
                  judge_request({"fresh inputs"}, {tests::passed_result(0, 0)}))
                .value);
}

}  // namespace
