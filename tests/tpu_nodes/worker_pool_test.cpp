// A tpu_node and its worker pool on CAF's real scheduler with a real JAX worker (detached
// actor, real process): modeled profiles, VMEM OOM, references, and candidates that crash
// or hang the worker while the node keeps serving. One warm pool serves the binary.
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "maxkernel/schema/profile.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"
#include "search/evaluation_store.hpp"
#include "tests/support/eval_requests.hpp"
#include "tpu_nodes/tpu_node.hpp"
#include "tpu_nodes/worker_pool.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <gtest/gtest.h>

#include <memory>
#include <optional>

using namespace maxkernel;
using namespace std::chrono_literals;
using messages::error_code;
using messages::payload;
using test_support::eval_request;
using test_support::request_options;
using test_support::test_kernel;

namespace {

struct reply {
  std::optional<payload> value;
  caf::error error;
  std::optional<messages::decoded_message> result;  // decoded EvalResult

  schema::EvalResult::Reader root() { return result->root<schema::EvalResult>(); }
  schema::PhaseResult::Reader phase(schema::Phase which) {
    for (auto p : root().getPhases())
      if (p.getPhase() == which)
        return p;
    ADD_FAILURE() << "no such phase";
    return root().getPhases()[0];
  }
  bool has_class(schema::ErrorClass cls) {
    for (auto p : root().getPhases())
      if (p.getErrorClass() == cls)
        return true;
    return false;
  }
  std::string phases_text() {
    std::string out;
    for (auto p : root().getPhases())
      out += std::to_string(static_cast<int>(p.getPhase())) + ":"
             + std::to_string(static_cast<int>(p.getStatus())) + ":"
             + std::to_string(static_cast<int>(p.getErrorClass())) + " " + p.getMessage().cStr()
             + "\n";
    return out;
  }
};

void decode(reply& r) {
  if (!r.value)
    return;
  std::string err;
  r.result = messages::open_payload<schema::EvalResult>(*r.value, err);
  EXPECT_TRUE(r.result) << err;
}

class WorkerPool : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    cfg = std::make_unique<caf::actor_system_config>();
    messages::register_types(*cfg);
    sys = std::make_unique<caf::actor_system>(*cfg);
    std::string err;
    store = search::evaluation_store::open(":memory:", err);
    ASSERT_TRUE(store) << err;
    tpu_nodes::pool_config pc;
    pc.workers = 1;
    pool = tpu_nodes::spawn_worker_pool(*sys, pc);
    tpu_nodes::node_config nc;
    nc.node_id = "test:0";
    nc.store = store.get();
    node = tpu_nodes::spawn_tpu_node(*sys, nc, pool);
  }

  static void TearDownTestSuite() {
    {
      caf::scoped_actor self{*sys};
      self->send_exit(node, caf::exit_reason::user_shutdown);
      self->send_exit(pool, caf::exit_reason::user_shutdown);
    }
    node = nullptr;
    pool = nullptr;
    sys.reset();  // waits for the actors, so the worker process is gone after it
    store.reset();
    cfg.reset();
  }

  static reply evaluate(const payload& request, uint32_t deadline_ms = 0) {
    caf::scoped_actor self{*sys};
    reply r;
    self->request(node, 600s, messages::evaluate_atom::value, request, deadline_ms)
      .receive([&](payload& p) { r.value = std::move(p); }, [&](caf::error& e) { r.error = e; });
    decode(r);
    return r;
  }

  template <class Handle>
  static std::optional<messages::decoded_message> info(const Handle& h) {
    caf::scoped_actor self{*sys};
    std::optional<messages::decoded_message> out;
    self->request(h, 60s, messages::info_atom::value)
      .receive(
        [&](payload& p) {
          std::string err;
          out = messages::open_payload<schema::NodeInfo>(p, err);
          EXPECT_TRUE(out) << err;
        },
        [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
    return out;
  }

  static std::unique_ptr<caf::actor_system_config> cfg;
  static std::unique_ptr<caf::actor_system> sys;
  static std::unique_ptr<search::evaluation_store> store;
  static messages::worker_pool_actor pool;
  static messages::tpu_node_actor node;
};

std::unique_ptr<caf::actor_system_config> WorkerPool::cfg;
std::unique_ptr<caf::actor_system> WorkerPool::sys;
std::unique_ptr<search::evaluation_store> WorkerPool::store;
messages::worker_pool_actor WorkerPool::pool;
messages::tpu_node_actor WorkerPool::node;

// The correct matmul with a marker comment: another source, so another store key.
std::string matmul_variant(const std::string& marker) {
  return test_kernel("matmul") + "\n# " + marker + "\n";
}

}  // namespace

TEST_F(WorkerPool, CorrectKernelIsCorrectWithAModeledProfile) {
  auto r = evaluate(eval_request(test_kernel("matmul")));
  ASSERT_TRUE(r.result) << caf::to_string(r.error);
  EXPECT_TRUE(r.root().getCorrect()) << r.phases_text();
  EXPECT_EQ(std::string(r.root().getBackend().cStr()), "model");
  ASSERT_EQ(r.root().getPhases().size(), 4u) << r.phases_text();
  for (auto p : r.root().getPhases())
    EXPECT_EQ(p.getStatus(), schema::Status::OK) << r.phases_text();
  ASSERT_TRUE(r.root().getHasProfile());
  auto profile = r.root().getProfile();
  EXPECT_EQ(profile.getTiming(), schema::Timing::MODELED);
  EXPECT_EQ(std::string(profile.getChip().cStr()), "v6e");
  EXPECT_EQ(std::string(profile.getBackend().cStr()), "model");
  EXPECT_GT(profile.getTimeUs(), 0);
  // 2 * 256^3 flops of a 256 matmul: the model counts the kernel's MXU work.
  EXPECT_NEAR(profile.getFlops(), 2.0 * 256 * 256 * 256, 2.0 * 256 * 256 * 256 * 0.01);
  EXPECT_TRUE(r.root().getHasStructure());
  EXPECT_GE(r.root().getTest().getCases().size(), 1u);
}

TEST_F(WorkerPool, KernelThatFailsItsTestStillHasItsProfile) {
  auto r = evaluate(eval_request(test_kernel("matmul_off_by_one")));
  ASSERT_TRUE(r.result) << caf::to_string(r.error);
  EXPECT_FALSE(r.root().getCorrect());
  EXPECT_EQ(r.phase(schema::Phase::TEST).getStatus(), schema::Status::FAILED) << r.phases_text();
  EXPECT_EQ(r.phase(schema::Phase::LOWER).getStatus(), schema::Status::OK) << r.phases_text();
  EXPECT_EQ(r.phase(schema::Phase::PROFILE).getStatus(), schema::Status::OK) << r.phases_text();
  ASSERT_TRUE(r.root().getHasProfile());
  EXPECT_GT(r.root().getProfile().getTimeUs(), 0);
}

TEST_F(WorkerPool, ChipOfTheRequestIsTheOneModeled) {
  request_options o;
  o.chip = "v5e";
  auto v5e = evaluate(eval_request(matmul_variant("v5e"), o));
  ASSERT_TRUE(v5e.result) << caf::to_string(v5e.error);
  ASSERT_TRUE(v5e.root().getHasProfile()) << v5e.phases_text();
  EXPECT_EQ(std::string(v5e.root().getProfile().getChip().cStr()), "v5e");
  o.chip = "v9z";
  auto unknown = evaluate(eval_request(matmul_variant("v9z"), o));
  EXPECT_EQ(messages::code_of(unknown.error), error_code::bad_input);
  EXPECT_NE(messages::message_of(unknown.error).find("v9z"), std::string::npos)
    << messages::message_of(unknown.error);
}

TEST_F(WorkerPool, ReferenceIsProfiledByTheXlaModel) {
  request_options o;
  o.reference = true;
  auto r = evaluate(eval_request("", o));
  ASSERT_TRUE(r.result) << caf::to_string(r.error);
  ASSERT_TRUE(r.root().getHasProfile()) << r.phases_text();
  EXPECT_EQ(r.phase(schema::Phase::PROFILE).getStatus(), schema::Status::OK);
  EXPECT_GT(r.root().getProfile().getTimeUs(), 0);
  EXPECT_EQ(r.root().getProfile().getTiming(), schema::Timing::MODELED);
  EXPECT_FALSE(r.root().getHasStructure());
}

TEST_F(WorkerPool, VmemOomFailsTheLowerPhaseAndSkipsTheRest) {
  auto source = test_kernel("matmul");
  auto at = source.find("BM = BN = BK = 128");
  ASSERT_NE(at, std::string::npos);
  source.replace(at, 18, "BM = BN = BK = 2048");
  request_options o;
  o.size = 2048;
  auto r = evaluate(eval_request(source, o));
  ASSERT_TRUE(r.result) << caf::to_string(r.error);
  auto lower = r.phase(schema::Phase::LOWER);
  EXPECT_EQ(lower.getStatus(), schema::Status::FAILED) << r.phases_text();
  EXPECT_EQ(lower.getErrorClass(), schema::ErrorClass::VMEM_OOM) << r.phases_text();
  EXPECT_NE(std::string(lower.getMessage().cStr()).find("VMEM"), std::string::npos);
  EXPECT_EQ(r.phase(schema::Phase::TEST).getStatus(), schema::Status::SKIPPED);
  EXPECT_EQ(r.phase(schema::Phase::PROFILE).getStatus(), schema::Status::SKIPPED);
  EXPECT_FALSE(r.root().getCorrect());
  EXPECT_FALSE(r.root().getHasProfile());
}

TEST_F(WorkerPool, CrashedCandidateIsReportedAndTheQueueIsKept) {
  auto before = info(pool);
  auto restarts = before->root<schema::NodeInfo>().getWorkerStates()[0].getRestarts();
  // Both queued behind one worker: the crash restarts it, the next request is still served.
  caf::scoped_actor self{*sys};
  reply crashed, next;
  auto h1 = self->request(node, 600s, messages::evaluate_atom::value,
                          eval_request(test_kernel("crash_exit")));
  auto h2 = self->request(node, 600s, messages::evaluate_atom::value,
                          eval_request(matmul_variant("after crash")));
  h1.receive([&](payload& p) { crashed.value = std::move(p); },
             [&](caf::error& e) { crashed.error = e; });
  h2.receive([&](payload& p) { next.value = std::move(p); }, [&](caf::error& e) { next.error = e; });
  decode(crashed);
  decode(next);
  ASSERT_TRUE(crashed.result) << caf::to_string(crashed.error);
  EXPECT_TRUE(crashed.has_class(schema::ErrorClass::CRASH)) << crashed.phases_text();
  EXPECT_NE(crashed.phases_text().find("exit code 3"), std::string::npos) << crashed.phases_text();
  EXPECT_FALSE(crashed.root().getCorrect());
  ASSERT_TRUE(next.result) << caf::to_string(next.error);
  EXPECT_TRUE(next.root().getCorrect()) << next.phases_text();
  auto after = info(pool);
  EXPECT_GT(after->root<schema::NodeInfo>().getWorkerStates()[0].getRestarts(), restarts);
  EXPECT_EQ(std::string(after->root<schema::NodeInfo>().getWorkerStates()[0].getState().cStr()),
            "idle");
}

TEST_F(WorkerPool, SegfaultAtImportIsACrash) {
  auto r = evaluate(eval_request("import ctypes\nctypes.string_at(0xFFFF800000001000, 8)\n"
                                 "def workload(a, b):\n    return a\n"));
  ASSERT_TRUE(r.result) << caf::to_string(r.error);
  EXPECT_TRUE(r.has_class(schema::ErrorClass::CRASH)) << r.phases_text();
  EXPECT_NE(r.phases_text().find("signal 11"), std::string::npos) << r.phases_text();
  auto next = evaluate(eval_request(matmul_variant("after segfault")));
  ASSERT_TRUE(next.result) << caf::to_string(next.error);
  EXPECT_TRUE(next.root().getCorrect()) << next.phases_text();
}

TEST_F(WorkerPool, HangingCandidateTimesOutAndTheNextRequestSucceeds) {
  auto started = std::chrono::steady_clock::now();
  auto hung = evaluate(eval_request(test_kernel("hang")), 3000);
  auto waited = std::chrono::steady_clock::now() - started;
  EXPECT_FALSE(hung.value);
  EXPECT_EQ(messages::code_of(hung.error), error_code::worker_timeout) << caf::to_string(hung.error);
  EXPECT_GE(waited, 3s);
  EXPECT_LT(waited, 30s);
  auto next = evaluate(eval_request(matmul_variant("after hang")));
  ASSERT_TRUE(next.result) << caf::to_string(next.error);
  EXPECT_TRUE(next.root().getCorrect()) << next.phases_text();
  auto ni = info(node);
  EXPECT_GE(ni->root<schema::NodeInfo>().getTimeouts(), 1u);
  // The hang's late result is a timeout: never recorded.
  auto again = evaluate(eval_request(test_kernel("hang")), 3000);
  EXPECT_EQ(messages::code_of(again.error), error_code::worker_timeout);
}
