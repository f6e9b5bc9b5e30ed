// messages::encode writes capnp's flat form (the bytes of capnp::messageToFlatArray, which
// every reader of our files and sockets expects) for messages of one and of many segments,
// and decoded_message::from_own reads what this process encoded as decode does.
#include "maxkernel/schema/candidate.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "messages/capnp_io.hpp"

#include <capnp/serialize.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

namespace {
// A message whose root struct holds a list of `entries` pointers that all point at one blob
// of `blob_bytes` bytes: small on the wire, read `entries` times by a walk of its pointers.
std::string shared_blob_message(uint32_t entries, uint32_t blob_bytes) {
  auto list_pointer = [](int32_t offset, uint64_t element_size, uint64_t count) {
    return 1ull | (static_cast<uint64_t>(static_cast<uint32_t>(offset) & 0x3fffffffu) << 2) |
           (element_size << 32) | (count << 35);
  };
  std::vector<uint64_t> segment;
  segment.push_back(0ull | (1ull << 48));        // root: a struct of 0 data words, 1 pointer
  segment.push_back(list_pointer(0, 6, entries));  // its pointer: a list of pointers
  for (uint32_t i = 0; i < entries; ++i)            // each at the blob after the list
    segment.push_back(list_pointer(static_cast<int32_t>(entries - 1 - i), 2, blob_bytes));
  segment.resize(segment.size() + (blob_bytes + 7) / 8, 0);
  std::vector<uint32_t> table{0, static_cast<uint32_t>(segment.size())};
  std::string bytes(reinterpret_cast<const char*>(table.data()), 8);
  bytes.append(reinterpret_cast<const char*>(segment.data()), segment.size() * 8);
  return bytes;
}
}  // namespace

// CPU amplification: 24 KB whose walk would read 16 MB (2000 x one 8 KB blob), and 24 bytes
// that hold a million empty structs, are refused by the check, as capnp refuses a walk past
// its traversal limit; the same blob read once, and a message as large built by a builder,
// pass.
TEST(CapnpIo, AMessageWhosePointersShareAnObjectIsRefused) {
  std::string error;
  EXPECT_FALSE(messages::decoded_message::parse(shared_blob_message(2000, 8000), error));
  EXPECT_NE(error.find("traversal limit"), std::string::npos) << error;
  error.clear();
  EXPECT_TRUE(messages::decoded_message::parse(shared_blob_message(1, 8000), error)) << error;

  // 24 bytes holding a list of a million empty structs (capnp counts a word per element).
  // table; root: a struct of 1 pointer; that pointer: an inline-composite list; its tag.
  std::vector<uint64_t> empties{0, 1ull << 48, 1ull | (7ull << 32), 1000000ull << 2};
  empties[0] = 3ull << 32;  // the table: 1 segment of 3 words
  EXPECT_FALSE(messages::decoded_message::parse(
    std::string(reinterpret_cast<const char*>(empties.data()), empties.size() * 8), error));
  EXPECT_NE(error.find("traversal limit"), std::string::npos) << error;

  capnp::MallocMessageBuilder message;
  auto c = message.initRoot<schema::Candidate>();
  c.setSchemaVersion(schema::SCHEMA_VERSION);
  auto params = c.initParams(2000);
  for (unsigned i = 0; i < params.size(); ++i) {
    params[i].setName(std::string(200, 'n'));
    params[i].setValue(std::to_string(i));
  }
  EXPECT_TRUE(messages::decode<schema::Candidate>(messages::encode(message), error)) << error;
}
