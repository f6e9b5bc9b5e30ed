// Round trips of Cap'n Proto payloads through encoding and through CAF's serializers, and
// refusal of malformed bytes.
#include "maxkernel/schema/candidate.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/message.hpp>
#include <caf/make_message.hpp>

#include <gtest/gtest.h>

using namespace maxkernel;
using messages::payload;

namespace {

payload sample_candidate() {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::Candidate>();
  c.setSchemaVersion(schema::SCHEMA_VERSION);
  c.setId("abc");
  c.setSource("def workload(x):\n  return x\n");
  auto params = c.initParams(1);
  params[0].setName("bm");
  params[0].setValue("256");
  return messages::make_payload<schema::Candidate>(msg);
}

}  // namespace

TEST(Payload, RoundTripsThroughEncoding) {
  auto p = sample_candidate();
  std::string err;
  auto msg = messages::open_payload<schema::Candidate>(p, err);
  ASSERT_TRUE(msg) << err;
  auto c = msg->root<schema::Candidate>();
  EXPECT_EQ(std::string(c.getId().cStr()), "abc");
  EXPECT_EQ(std::string(c.getParams()[0].getValue().cStr()), "256");
}

TEST(Payload, RefusesAnotherType) {
  auto p = sample_candidate();
  std::string err;
  EXPECT_FALSE(messages::open_payload<schema::EvalResult>(p, err));
  EXPECT_NE(err.find("another message type"), std::string::npos);
}

TEST(Payload, RefusesTruncatedAndGarbageBytes) {
  auto p = sample_candidate();
  std::string err;
  EXPECT_FALSE(messages::decode<schema::Candidate>(p.bytes.substr(0, p.bytes.size() - 8), err));
  EXPECT_NE(err.find("malformed"), std::string::npos);
  std::string garbage(64, '\xff');
  EXPECT_FALSE(messages::decode<schema::Candidate>(garbage, err));
  EXPECT_FALSE(messages::decode<schema::Candidate>("abc", err));
  EXPECT_FALSE(messages::decode<schema::Candidate>("", err));
}

TEST(Payload, RefusesOtherSchemaVersion) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::Candidate>();
  c.setSchemaVersion(schema::SCHEMA_VERSION + 1);
  std::string err;
  EXPECT_FALSE(messages::decode<schema::Candidate>(messages::encode(msg), err));
  EXPECT_NE(err.find("schema version"), std::string::npos);
}

TEST(Payload, SurvivesCafSerialization) {
  caf::actor_system_config cfg;
  messages::register_types(cfg);
  caf::actor_system sys{cfg};
  auto original = caf::make_message(sample_candidate());
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  ASSERT_FALSE(sink(original));
  caf::message copy;
  caf::binary_deserializer source{sys, buf};
  ASSERT_FALSE(source(copy));
  ASSERT_TRUE(copy.match_elements<payload>());
  EXPECT_EQ(copy.get_as<payload>(0), sample_candidate());
}

// A payload this process built is opened without the walk; one that crossed a process
// boundary never counts as built here, whatever the sender's flag said.
TEST(Payload, OwnOnlyInTheProcessThatBuiltIt) {
  auto p = sample_candidate();
  EXPECT_TRUE(p.own);
  caf::actor_system_config cfg;
  messages::register_types(cfg);
  caf::actor_system sys{cfg};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  ASSERT_FALSE(sink(caf::make_message(p)));
  caf::message copy;
  caf::binary_deserializer source{sys, buf};
  ASSERT_FALSE(source(copy));
  EXPECT_FALSE(copy.get_as<payload>(0).own);
  // Deserializing into a payload that was own does not keep the flag either.
  payload into = sample_candidate();
  std::vector<char> one;
  caf::binary_serializer out{sys, one};
  ASSERT_FALSE(inspect(out, p));
  caf::binary_deserializer in{sys, one};
  ASSERT_FALSE(inspect(in, into));
  EXPECT_FALSE(into.own);
  EXPECT_EQ(into, p);
  // Bytes that arrive in a payload not marked own are checked: truncated ones are refused.
  payload foreign{p.type_id, p.bytes.substr(0, p.bytes.size() - 8)};
  std::string err;
  EXPECT_FALSE(messages::open_payload<schema::Candidate>(foreign, err));
  EXPECT_NE(err.find("malformed"), std::string::npos);
}

TEST(Payload, OwnIsStillCheckedForItsSchemaVersionAndType) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::Candidate>();
  c.setSchemaVersion(schema::SCHEMA_VERSION + 1);
  auto p = messages::make_payload<schema::Candidate>(msg);
  ASSERT_TRUE(p.own);
  std::string err;
  EXPECT_FALSE(messages::open_payload<schema::Candidate>(p, err));
  EXPECT_NE(err.find("schema version"), std::string::npos);
  err.clear();
  EXPECT_FALSE(messages::open_payload<schema::EvalResult>(sample_candidate(), err));
  EXPECT_NE(err.find("another message type"), std::string::npos);
}

TEST(Errors, CarryCodeAndMessage) {
  auto err = messages::make_error(messages::error_code::bad_input, "spec.yaml:3:5: inputs: bad");
  EXPECT_EQ(messages::code_of(err), messages::error_code::bad_input);
  EXPECT_EQ(messages::message_of(err), "spec.yaml:3:5: inputs: bad");
  EXPECT_EQ(messages::exit_code_for(messages::code_of(err)), 2);
  EXPECT_EQ(messages::exit_code_for(messages::error_code::worker_unavailable), 3);
}
