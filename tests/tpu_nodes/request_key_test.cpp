// The evaluation key of a request (tpu_nodes/request_key) over requests built the one way
// commands build them (tpu_nodes/eval_request): every option that changes a result changes
// the key, the tester's modes included, and a request without the modes keeps the options
// text it had before they existed. The evaluator revision the node passes is a part of it
// too (evaluator_revision_test.cpp).
#include "messages/eval_request.hpp"
#include "search/evaluation_key.hpp"
#include "tpu_nodes/evaluator_revision.hpp"
#include "tpu_nodes/request_key.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

using namespace maxkernel;
using messages::request_settings;

namespace {

const char* kernel_source = "def workload(a, b):\n    return a @ b\n";

struct built {
  capnp::MallocMessageBuilder spec_msg;
  capnp::MallocMessageBuilder msg;
  schema::EvalRequest::Reader request;
};

void build(built& b, const request_settings& settings) {
  auto spec = b.spec_msg.initRoot<schema::KernelSpec>();
  spec.setSchemaVersion(schema::SCHEMA_VERSION);
  spec.setName("matmul");
  spec.setChip("v5e");
  spec.setReference("def reference(a, b):\n    return a @ b\n");
  messages::build_eval_request(b.msg.initRoot<schema::EvalRequest>(), spec.asReader(),
                                kernel_source, "test", settings);
  b.request = b.msg.getRoot<schema::EvalRequest>().asReader();
}

std::string key_of(const request_settings& settings) {
  built b;
  build(b, settings);
  return tpu_nodes::request_key(b.request, "v5e", "model", "0.10.2", "e1");
}

std::string options_of(const request_settings& settings) {
  built b;
  build(b, settings);
  return tpu_nodes::result_options(b.request, "model");
}

request_settings seeds(std::vector<uint64_t> s) {
  request_settings r;
  r.seeds = std::move(s);
  return r;
}

TEST(RequestKey, BuildEvalRequestCarriesTheTestersModes) {
  auto settings = seeds({4});
  settings.value_mode = "large";
  settings.value_scale = 250;
  settings.shape_mode = "ragged";
  built b;
  build(b, settings);
  auto options = b.request.getOptions();
  EXPECT_EQ(options.getValueMode(), "large");
  EXPECT_DOUBLE_EQ(options.getValueScale(), 250);
  EXPECT_EQ(options.getShapeMode(), "ragged");
  EXPECT_EQ(options.getChip(), "v5e");
  ASSERT_EQ(options.getSeeds().size(), 1u);
  EXPECT_EQ(options.getSeeds()[0], 4u);

  built plain;
  build(plain, seeds({4}));
  EXPECT_FALSE(plain.request.getOptions().hasValueMode());
  EXPECT_FALSE(plain.request.getOptions().hasShapeMode());
}

// What judged and priced a result is part of its key: another worker, pricing or chip file
// (another evaluator revision) does not share it.
TEST(RequestKey, TheEvaluatorRevisionIsPartOfTheKey) {
  built b;
  build(b, request_settings{});
  auto key = tpu_nodes::request_key(b.request, "v5e", "model", "0.10.2", "e1");
  EXPECT_EQ(tpu_nodes::request_key(b.request, "v5e", "model", "0.10.2", "e1"), key);
  EXPECT_NE(tpu_nodes::request_key(b.request, "v5e", "model", "0.10.2", "e2"), key);
}

TEST(RequestKey, WithoutModesTheOptionsTextIsUnchanged) {
  EXPECT_EQ(options_of(seeds({1, 2})), "configuration=0;seeds=1,2;full=0");
  auto full = seeds({});
  full.full = true;
  EXPECT_EQ(options_of(full), "configuration=0;seeds=;full=1");
}

TEST(RequestKey, EachModeHasItsOwnKey) {
  std::set<std::string> keys;
  auto add = [&](const request_settings& s) { return keys.insert(key_of(s)).second; };
  EXPECT_TRUE(add(seeds({0})));
  for (const char* mode : {"large", "zeros", "sparse"}) {
    auto s = seeds({0});
    s.value_mode = mode;
    EXPECT_TRUE(add(s)) << mode;
  }
  auto scaled = seeds({0});
  scaled.value_mode = "large";
  scaled.value_scale = 100;
  EXPECT_TRUE(add(scaled)) << "another scale is another result";
  auto ragged = seeds({0});
  ragged.shape_mode = "ragged";
  EXPECT_TRUE(add(ragged));
  auto both = ragged;
  both.value_mode = "large";
  EXPECT_TRUE(add(both));
  EXPECT_EQ(keys.size(), 7u);

  // The same request gives the same key.
  EXPECT_EQ(key_of(both), key_of(both));
  EXPECT_EQ(options_of(both), "configuration=0;seeds=0;full=0;valueMode=large;valueScale=0;"
                              "shapeMode=ragged");
  EXPECT_EQ(options_of(scaled), "configuration=0;seeds=0;full=0;valueMode=large;valueScale=100");
}

TEST(RequestKey, AReferenceIgnoresTheTestersModes) {
  // A reference request is timed, never tested: its modes cannot change its result.
  auto plain = seeds({});
  plain.reference = true;
  auto moded = plain;
  moded.value_mode = "zeros";
  moded.shape_mode = "ragged";
  EXPECT_EQ(key_of(plain), key_of(moded));
}

TEST(RequestKey, AStoreScopeSeparatesCandidatesAndReferences) {
  // `bench --modes` on a cluster: one store, a scope per mode; no mode's request may be
  // answered by another's result, the reference's time included.
  for (bool reference : {false, true}) {
    auto shared = seeds({1});
    shared.reference = reference;
    auto a = shared;
    a.store_scope = "bench-auto";
    auto g = shared;
    g.store_scope = "bench-graph";
    EXPECT_NE(key_of(shared), key_of(a)) << reference;
    EXPECT_NE(key_of(a), key_of(g)) << reference;
    EXPECT_EQ(key_of(a), key_of(a)) << reference;
    built b;
    build(b, a);
    EXPECT_EQ(b.request.getOptions().getStoreScope(), "bench-auto");
  }
  // Unscoped, the options text is the one stored before scopes existed.
  EXPECT_EQ(options_of(seeds({1})), "configuration=0;seeds=1;full=0");
  auto scoped = seeds({1});
  scoped.store_scope = "s/bench-graph";
  EXPECT_EQ(options_of(scoped), "configuration=0;seeds=1;full=0;storeScope=s/bench-graph");
}

}  // namespace

// The nodes of a process share the key prefixes (normalised, hashed sources) of recent
// candidates: the key stays the one search::evaluation_key makes from the raw source, for
// sources seen again, sources with only trailing blanks or CR/LF changed, and past the point
// where old sources are dropped.
TEST(RequestKey, SharedNormalisedSourcesGiveTheDirectKey) {
  std::set<std::string> keys;
  for (int round = 0; round < 2; ++round) {
    for (int n = 0; n < 150; ++n) {
      std::string source = "def workload(a):\n    return a  \n# " + std::to_string(n) + "\n";
      capnp::MallocMessageBuilder spec_msg;
      auto spec = spec_msg.initRoot<schema::KernelSpec>();
      spec.setName("matmul");
      capnp::MallocMessageBuilder msg;
      request_settings settings;
      settings.chip = "v5e";
      messages::build_eval_request(msg.initRoot<schema::EvalRequest>(), spec.asReader(), source,
                                   "test", settings);
      auto evaluator = tpu_nodes::evaluator_revision("model", "v5e");
      auto request = msg.getRoot<schema::EvalRequest>().asReader();
      auto key = tpu_nodes::request_key(request, "v5e", "model", "0.10.2", evaluator);
      auto hash = tpu_nodes::spec_hash(spec.asReader());
      auto options = tpu_nodes::result_options(request, "model");
      search::evaluation_key_parts parts;
      parts.source = source;
      parts.spec_hash = hash;
      parts.chip = "v5e";
      parts.backend = "model";
      parts.jax_version = "0.10.2";
      parts.options = options;
      parts.evaluator = evaluator;
      EXPECT_EQ(key, search::evaluation_key(parts)) << n;
      std::string crlf = "def workload(a):\r\n    return a\r\n# " + std::to_string(n) + "\n\n";
      parts.source = crlf;
      EXPECT_EQ(key, search::evaluation_key(parts)) << n;
      keys.insert(key);
    }
  }
  EXPECT_EQ(keys.size(), 150u);
}

// A task read from another directory (a cluster submission's own copy, a moved checkout) is
// the same task: its stored results answer it. What the spec says still counts.
TEST(RequestKey, TheSpecsPathsAreNotPartOfItsHash) {
  auto make = [](const char* source_path, const char* baseline_path, const char* reference) {
    auto msg = std::make_unique<capnp::MallocMessageBuilder>();
    auto spec = msg->initRoot<schema::KernelSpec>();
    spec.setSchemaVersion(schema::SCHEMA_VERSION);
    spec.setName("matmul");
    spec.setSourcePath(source_path);
    spec.setBaselinePath(baseline_path);
    spec.setReference(reference);
    auto files = spec.initTaskFiles(1);
    files[0].setPath("helpers.py");
    files[0].setData(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>("X = 1\n"), 6));
    return msg;
  };
  const char* ref = "def reference(a, b):\n    return a @ b\n";
  auto here = make("/home/a/task", "/home/a/task/baselines/k.py", ref);
  auto there = make("/state/submissions/7/task", "/state/submissions/7/task/baselines/k.py", ref);
  auto other = make("/home/a/task", "/home/a/task/baselines/k.py",
                    "def reference(a, b):\n    return b @ a\n");
  auto hash = [](std::unique_ptr<capnp::MallocMessageBuilder>& m) {
    return tpu_nodes::spec_hash(m->getRoot<schema::KernelSpec>().asReader());
  };
  EXPECT_EQ(hash(here), hash(there));
  EXPECT_NE(hash(here), hash(other));
  auto edited = make("/home/a/task", "", ref);
  edited->getRoot<schema::KernelSpec>().getTaskFiles()[0].setData(
    capnp::Data::Reader(reinterpret_cast<const capnp::byte*>("X = 2\n"), 6));
  EXPECT_NE(hash(here), hash(edited));  // a shipped file's content is part of the task
}
