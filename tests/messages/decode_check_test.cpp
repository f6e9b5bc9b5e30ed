// messages::decode's check (the planned walk of capnp_io.cpp) against the reference walk it
// replaces (check_traversal_dynamic: every field through capnp's dynamic API): on valid
// messages and on thousands of corrupted copies of them, both must accept and refuse the same
// bytes with the same error. The messages cover unions (KernelSpec's Generator, WorkerReply),
// lists of structs, of text and of lists, and groups (capnp's own schema.Node, whose field,
// type and value groups nest unions), and a message nested past the depth where the planned
// walk hands over to the dynamic one.
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/capnp_io.hpp"

#include <capnp/message.h>
#include <capnp/schema.capnp.h>
#include <capnp/schema.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>

using namespace maxkernel;

namespace {

struct outcome {
  bool ok = false;
  std::string error;
};

outcome check(const std::string& bytes, capnp::StructSchema type, bool planned) {
  outcome o;
  std::string error;
  auto msg = messages::decoded_message::parse(bytes, error);
  if (!msg) {
    o.error = "parse: " + error;
    return o;
  }
  o.ok = planned ? messages::check_traversal(*msg, type, o.error)
                 : messages::check_traversal_dynamic(*msg, type, o.error);
  return o;
}

// Both walks on `bytes` and on `copies` corruptions of it: random words overwritten with
// random values, with pointer-shaped values (a struct, list or far pointer with random
// offset and size bits), or with bytes of another word of the message. Returns the number
// of corrupted copies the checks refused (so the test knows it exercised failures).
int compare(const std::string& bytes, capnp::StructSchema type, int copies, uint32_t seed) {
  auto clean_planned = check(bytes, type, true);
  auto clean_dynamic = check(bytes, type, false);
  EXPECT_EQ(clean_planned.ok, clean_dynamic.ok) << clean_dynamic.error;
  EXPECT_EQ(clean_planned.error, clean_dynamic.error);
  std::mt19937 rng(seed);
  size_t words = bytes.size() / 8;
  int refused = 0;
  for (int n = 0; n < copies; ++n) {
    std::string bad = bytes;
    int changes = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < changes; ++c) {
      size_t at = 1 + rng() % (words - 1);  // word 0 is the segment table
      uint64_t v = 0;
      switch (rng() % 4) {
        case 0: v = (uint64_t{rng()} << 32) | rng(); break;
        case 1: {  // a pointer: kind in the low 2 bits, a small offset, random sizes
          uint64_t kind = rng() % 4;
          int64_t offset = static_cast<int64_t>(rng() % 64) - 32;
          v = kind | (static_cast<uint64_t>(offset) << 2 & 0xffffffffu) |
              (uint64_t{rng() % 8} << 32) | (uint64_t{rng() % 64} << 35);
          break;
        }
        case 2: std::memcpy(&v, bytes.data() + 8 * (1 + rng() % (words - 1)), 8); break;
        case 3: {  // one byte flipped
          std::memcpy(&v, bad.data() + 8 * at, 8);
          v ^= uint64_t{1 + rng() % 255} << (8 * (rng() % 8));
          break;
        }
      }
      std::memcpy(bad.data() + 8 * at, &v, 8);
    }
    auto planned = check(bad, type, true);
    auto dynamic = check(bad, type, false);
    EXPECT_EQ(planned.ok, dynamic.ok) << "copy " << n << ": planned '" << planned.error
                                      << "', dynamic '" << dynamic.error << "'";
    EXPECT_EQ(planned.error, dynamic.error) << "copy " << n;
    refused += dynamic.ok ? 0 : 1;
  }
  return refused;
}

template <class T>
capnp::StructSchema schema_of() {
  return capnp::Schema::from<T>();
}

void fill_spec(schema::KernelSpec::Builder spec) {
  spec.setName("matmul");
  spec.setChip("v6e");
  auto configuration = spec.initConfigurations(1)[0];
  configuration.setName("default");
  auto inputs = configuration.initInputs(3);
  for (unsigned i = 0; i < 3; ++i) {
    inputs[i].setName(std::string("x") + std::to_string(i));
    auto dims = inputs[i].initDimNames(2);
    dims.set(0, "M");
    dims.set(1, "K");
    auto g = inputs[i].initGenerator();
    if (i == 0)
      g.initNormal().setStd(0.5);
    else if (i == 1)
      g.setCode("def generate(rng, shape, dtype, dims):\n  return rng.normal(size=shape)\n");
    else
      g.setOnes();
  }
}

std::string sample_vertex() {
  capnp::MallocMessageBuilder msg;
  auto v = msg.initRoot<schema::Vertex>();
  v.setIndex(3);
  v.setStrategy("growBlock");
  v.setState(schema::VertexState::EVALUATED);
  auto c = v.initCandidate();
  c.setSchemaVersion(schema::SCHEMA_VERSION);
  c.setId("abc");
  c.setSource("def workload(x):\n  return x\n");
  auto params = c.initParams(2);
  params[0].setName("bm");
  params[0].setValue("256");
  params[1].setName("bn");
  params[1].setValue("128");
  auto r = v.initResult();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  r.setCorrect(true);
  r.setKey("k");
  auto phases = r.initPhases(2);
  phases[0].setMessage("lowered");
  phases[1].setMessage("tested");
  v.setHasResult(true);
  auto f = v.initAttemptFailures(2);
  f.set(0, "lower");
  f.set(1, "test");
  return messages::encode(msg);
}

}  // namespace

TEST(DecodeCheck, SameVerdictAsTheDynamicWalkOnAVertex) {
  EXPECT_GT(compare(sample_vertex(), schema_of<schema::Vertex>(), 3000, 1), 100);
}

TEST(DecodeCheck, SameVerdictOnUnions) {
  capnp::MallocMessageBuilder spec_msg;
  fill_spec(spec_msg.initRoot<schema::KernelSpec>());
  EXPECT_GT(compare(messages::encode(spec_msg), schema_of<schema::KernelSpec>(), 3000, 2), 100);

  capnp::MallocMessageBuilder reply_msg;
  auto reply = reply_msg.initRoot<schema::WorkerReply>();
  reply.setId(9);
  fill_spec(reply.initSpec());
  EXPECT_GT(compare(messages::encode(reply_msg), schema_of<schema::WorkerReply>(), 3000, 3), 100);
}

TEST(DecodeCheck, SameVerdictOnGroupsAndListsOfLists) {
  // A Node of capnp's own schema (groups holding unions, lists of structs, annotations).
  capnp::MallocMessageBuilder msg;
  msg.setRoot(capnp::Schema::from<schema::Vertex>().getProto());
  EXPECT_GT(compare(messages::encode(msg), schema_of<capnp::schema::Node>(), 3000, 4), 100);
  // A Type of List(List(Text)): the list group's element type, twice over.
  capnp::MallocMessageBuilder type_msg;
  auto t = type_msg.initRoot<capnp::schema::Type>();
  t.initList().initElementType().initList().initElementType().setText();
  EXPECT_GE(compare(messages::encode(type_msg), schema_of<capnp::schema::Type>(), 1000, 5), 1);
}

TEST(DecodeCheck, SameVerdictPastTheDepthWhereTheDynamicWalkTakesOver) {
  // Types nested through the list group (two levels of depth each): 10 (planned all the
  // way), 20 (handed over half way), 40 (refused for its depth by both).
  for (int levels : {10, 20, 40}) {
    capnp::MallocMessageBuilder msg;
    auto t = msg.initRoot<capnp::schema::Type>();
    for (int i = 0; i < levels; ++i)
      t = t.initList().initElementType();
    t.setFloat64();
    auto bytes = messages::encode(msg);
    auto planned = check(bytes, schema_of<capnp::schema::Type>(), true);
    auto dynamic = check(bytes, schema_of<capnp::schema::Type>(), false);
    EXPECT_EQ(planned.ok, dynamic.ok) << levels;
    EXPECT_EQ(planned.error, dynamic.error) << levels;
    EXPECT_EQ(planned.ok, levels < 32) << levels << ": " << planned.error;
    compare(bytes, schema_of<capnp::schema::Type>(), 300, 6 + static_cast<uint32_t>(levels));
  }
}

TEST(DecodeCheck, RefusesATextWithoutItsNul) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::Candidate>();
  c.setSchemaVersion(schema::SCHEMA_VERSION);
  c.setId("abcdefg");  // 7 bytes + NUL: one word
  auto bytes = messages::encode(msg);
  auto at = bytes.find("abcdefg");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 7] = 'h';
  auto planned = check(bytes, schema_of<schema::Candidate>(), true);
  EXPECT_FALSE(planned.ok);
  EXPECT_NE(planned.error.find("cptr[unboundedSize] == '\\0'"), std::string::npos) << planned.error;
  EXPECT_EQ(planned.error, check(bytes, schema_of<schema::Candidate>(), false).error);
}
