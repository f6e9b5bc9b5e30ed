// The profiler's protocol under CAF's deterministic scheduler: a ProfilerRequest is
// answered with the Diagnosis; an unknown chip with bad_input; a payload that does not
// decode, or holds another message, with malformed_message; the actor survives each.
#include "agents/profiler_actor.hpp"
#include "maxkernel/schema/profile.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "tests/agents/profile_request.hpp"
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

class ProfilerActor : public ::testing::Test {
protected:
  void TearDown() override {
    env.self->send_exit(profiler, caf::exit_reason::user_shutdown);
    env.run_messages();
  }

  reply ask(const payload& p) {
    env.self->send(profiler, messages::diagnose_atom::value, p);
    env.run_messages();
    reply r;
    r.arrived = env.receive_now([&](payload& v) { r.value = std::move(v); },
                                [&](caf::error& e) { r.error = std::move(e); });
    return r;
  }

  static payload request(const std::string& chip) {
    tests::call_profile_spec cp;
    cp.name = "kernel";
    cp.bound = "overhead";
    cp.time_us = 90;
    cp.overhead_us = 80;
    cp.steps = 512;
    cp.vmem_bytes = 64 * 1024;
    tests::profile_spec p{"overhead", 90, 10, 0, {cp}};
    capnp::MallocMessageBuilder msg;
    tests::build_request(msg.initRoot<schema::ProfilerRequest>(), p, {}, chip);
    return messages::make_payload<schema::ProfilerRequest>(msg);
  }

  test_support::deterministic_system env;
  messages::profiler_actor profiler = agents::spawn_profiler(env.sys);
};

TEST_F(ProfilerActor, AnswersARequestWithTheDiagnosis) {
  auto r = ask(request("v6e"));
  ASSERT_TRUE(r.arrived);
  ASSERT_TRUE(r.value) << messages::message_of(r.error);
  std::string err;
  auto msg = messages::open_payload<schema::Diagnosis>(*r.value, err);
  ASSERT_TRUE(msg) << err;
  auto d = msg->root<schema::Diagnosis>();
  EXPECT_EQ(d.getChip(), "v6e");
  EXPECT_EQ(d.getBound(), "overhead");
  EXPECT_EQ(d.getTiming(), schema::Timing::MODELED);
  EXPECT_NEAR(d.getHeadroom(), 10.0 / 90.0, 1e-12);
  ASSERT_GE(d.getSuggestions().size(), 1u);
  // Without the structure no axis is named; v6e's 32 MiB scoped VMEM holds 512x the 64 KiB.
  EXPECT_EQ(d.getSuggestions()[0].getKind(), schema::SuggestionKind::REDUCE_STEPS);
  EXPECT_EQ(d.getSuggestions()[0].getAxis(), -1);
  EXPECT_DOUBLE_EQ(d.getSuggestions()[0].getFactor(), 512);
}

TEST_F(ProfilerActor, UnknownChipIsBadInput) {
  auto r = ask(request("v99"));
  ASSERT_TRUE(r.arrived);
  ASSERT_FALSE(r.value);
  EXPECT_EQ(messages::code_of(r.error), error_code::bad_input);
  EXPECT_NE(messages::message_of(r.error).find("v99"), std::string::npos)
      << messages::message_of(r.error);
  // The actor still serves.
  EXPECT_TRUE(ask(request("v5e")).value);
}

TEST_F(ProfilerActor, MalformedPayloadsAreErrorsNotCrashes) {
  payload garbage{capnp::typeId<schema::ProfilerRequest>(), "not a capnp message at all"};
  auto r = ask(garbage);
  ASSERT_TRUE(r.arrived);
  ASSERT_FALSE(r.value);
  EXPECT_EQ(messages::code_of(r.error), error_code::malformed_message);

  // A well-formed message of another type.
  capnp::MallocMessageBuilder other;
  other.initRoot<schema::Profile>().setSchemaVersion(schema::SCHEMA_VERSION);
  auto wrong = ask(messages::make_payload<schema::Profile>(other));
  ASSERT_TRUE(wrong.arrived);
  EXPECT_EQ(messages::code_of(wrong.error), error_code::malformed_message);

  // A request from another schema version.
  capnp::MallocMessageBuilder old;
  old.initRoot<schema::ProfilerRequest>().setChip("v6e");  // schemaVersion 0
  auto versioned = ask(messages::make_payload<schema::ProfilerRequest>(old));
  ASSERT_TRUE(versioned.arrived);
  EXPECT_EQ(messages::code_of(versioned.error), error_code::malformed_message);

  EXPECT_TRUE(ask(request("v6e")).value);
}

}  // namespace
