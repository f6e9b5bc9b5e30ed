// messages::encode writes capnp's flat form (the bytes of capnp::messageToFlatArray, which
// every reader of our files and sockets expects) for messages of one and of many segments,
// and decoded_message::from_own reads what this process encoded as decode does.
#include "maxkernel/schema/candidate.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "messages/capnp_io.hpp"

#include <capnp/serialize.h>

#include <gtest/gtest.h>

#include <string>

using namespace maxkernel;

namespace {

void fill(schema::Candidate::Builder c, unsigned params) {
  c.setSchemaVersion(schema::SCHEMA_VERSION);
  c.setId("abc");
  c.setSource(std::string(5000, 'x'));
  auto list = c.initParams(params);
  for (unsigned i = 0; i < params; ++i) {
    list[i].setName("p" + std::to_string(i));
    list[i].setValue(std::to_string(i * 7));
  }
}

std::string flat_array(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

}  // namespace

TEST(CapnpIo, EncodeWritesTheFlatArrayOfOneSegment) {
  capnp::MallocMessageBuilder message;
  fill(message.initRoot<schema::Candidate>(), 3);
  ASSERT_EQ(message.getSegmentsForOutput().size(), 1u);
  EXPECT_EQ(messages::encode(message), flat_array(message));
}

TEST(CapnpIo, EncodeWritesTheFlatArrayOfManySegments) {
  // A first segment of 8 words, fixed: every allocation past it opens a new segment.
  capnp::MallocMessageBuilder message(8, capnp::AllocationStrategy::FIXED_SIZE);
  fill(message.initRoot<schema::Candidate>(), 40);
  // More segments than encode's table holds without an allocation.
  ASSERT_GT(message.getSegmentsForOutput().size(), 16u);
  auto bytes = messages::encode(message);
  EXPECT_EQ(bytes, flat_array(message));
  std::string error;
  auto decoded = messages::decode<schema::Candidate>(bytes, error);
  ASSERT_TRUE(decoded) << error;
  auto c = decoded->root<schema::Candidate>();
  EXPECT_EQ(c.getSource().size(), 5000u);
  ASSERT_EQ(c.getParams().size(), 40u);
  EXPECT_EQ(std::string(c.getParams()[39].getValue().cStr()), "273");
}

TEST(CapnpIo, FromOwnReadsWhatDecodeReads) {
  capnp::MallocMessageBuilder message(8, capnp::AllocationStrategy::FIXED_SIZE);
  fill(message.initRoot<schema::Candidate>(), 12);
  auto bytes = messages::encode(message);
  auto own = messages::decoded_message::from_own(bytes);
  EXPECT_EQ(own.words() * sizeof(capnp::word), bytes.size());
  std::string error;
  auto checked = messages::decode<schema::Candidate>(bytes, error);
  ASSERT_TRUE(checked) << error;
  auto a = own.root<schema::Candidate>();
  auto b = checked->root<schema::Candidate>();
  EXPECT_EQ(a.getId(), b.getId());
  EXPECT_EQ(a.getSource(), b.getSource());
  ASSERT_EQ(a.getParams().size(), b.getParams().size());
  for (unsigned i = 0; i < a.getParams().size(); ++i)
    EXPECT_EQ(a.getParams()[i].getName(), b.getParams()[i].getName());
  // Read as often as a record reads its vertices: no traversal limit runs out.
  for (int k = 0; k < 20000; ++k)
    ASSERT_EQ(own.root<schema::Candidate>().getSource().size(), 5000u);
}
