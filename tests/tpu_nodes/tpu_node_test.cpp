// The tpu_node and worker_pool protocols under CAF's deterministic scheduler: the test
// decides which actor runs and when timers fire. The pool's worker is a real JAX worker
// (one, shared by the binary); under the test scheduler it is an ordinary actor, so its
// evaluations run inline when the test runs it.
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "search/evaluation_store.hpp"
#include "tests/support/deterministic_system.hpp"
#include "tests/support/eval_requests.hpp"
#include "tpu_nodes/tpu_node.hpp"
#include "tpu_nodes/worker_pool.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

using namespace maxkernel;
using namespace std::chrono_literals;
using messages::error_code;
using messages::payload;
using test_support::eval_request;
using test_support::request_options;
using test_support::test_kernel;

namespace {

struct reply {
  bool arrived = false;
  std::optional<payload> value;
  caf::error error;
};

template <class Handle>
caf::resumable* job_of(const Handle& h) {
  return dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(h));
}

std::optional<messages::decoded_message> open_result(const payload& p) {
  std::string err;
  auto msg = messages::open_payload<schema::EvalResult>(p, err);
  EXPECT_TRUE(msg) << err;
  return msg;
}

schema::PhaseResult::Reader phase(schema::EvalResult::Reader r, schema::Phase which) {
  for (auto p : r.getPhases())
    if (p.getPhase() == which)
      return p;
  ADD_FAILURE() << "no phase " << static_cast<int>(which);
  return r.getPhases()[0];
}

const std::string syntax_error = test_kernel("syntax_error");

class TpuNode : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    env = std::make_unique<test_support::deterministic_system>();
    tpu_nodes::pool_config pc;
    pc.workers = 1;
    shared_pool = tpu_nodes::spawn_worker_pool(env->sys, pc);
    env->run_messages();  // the worker starts (real JAX, a few seconds)
  }

  static void TearDownTestSuite() {
    env->self->send_exit(shared_pool, caf::exit_reason::user_shutdown);
    env->run_messages();
    shared_pool = nullptr;
    env.reset();
  }

  void TearDown() override {
    for (auto& a : spawned)
      env->self->send_exit(a, caf::exit_reason::user_shutdown);
    env->run_messages();
    spawned.clear();
  }

  messages::tpu_node_actor node(tpu_nodes::node_config cfg,
                                std::optional<messages::worker_pool_actor> pool = {},
                                bool run = true) {
    auto n = tpu_nodes::spawn_tpu_node(env->sys, std::move(cfg), pool ? *pool : shared_pool);
    spawned.push_back(caf::actor_cast<caf::actor>(n));
    if (run)
      env->run_messages();  // it asks the pool for the workers' JAX version
    return n;
  }

  static tpu_nodes::node_config config(search::evaluation_store* store = nullptr) {
    tpu_nodes::node_config cfg;
    cfg.node_id = "test:0";
    cfg.store = store;
    return cfg;
  }

  // Runs only the given actors' messages (everything else stays queued).
  template <class... Handles>
  void run_only(const Handles&... hs) {
    std::vector<caf::resumable*> jobs{job_of(hs)...};
    env->sched.run_jobs_filtered([&](caf::resumable* r) {
      return std::find(jobs.begin(), jobs.end(), r) != jobs.end();
    });
  }

  reply next_reply() {
    reply r;
    r.arrived = env->receive_now([&](payload& p) { r.value = std::move(p); },
                                 [&](caf::error& e) { r.error = std::move(e); });
    return r;
  }

  template <class Handle>
  schema::NodeInfo::Reader info(const Handle& h, std::optional<messages::decoded_message>& keep) {
    env->self->send(h, messages::info_atom::value);
    env->run_messages();
    auto r = next_reply();
    EXPECT_TRUE(r.arrived && r.value) << caf::to_string(r.error);
    std::string err;
    keep = messages::open_payload<schema::NodeInfo>(*r.value, err);
    EXPECT_TRUE(keep) << err;
    return keep->root<schema::NodeInfo>();
  }

  static std::unique_ptr<test_support::deterministic_system> env;
  static messages::worker_pool_actor shared_pool;
  std::vector<caf::actor> spawned;
};

std::unique_ptr<test_support::deterministic_system> TpuNode::env;
messages::worker_pool_actor TpuNode::shared_pool;

}  // namespace

TEST_F(TpuNode, StoreHitIsAnsweredWithoutReachingThePool) {
  std::string err;
  auto store = search::evaluation_store::open(":memory:", err);
  ASSERT_TRUE(store) << err;
  auto n = node(config(store.get()));
  auto source = test_kernel("matmul");

  // A real evaluation first: dispatched, evaluated by the worker, recorded.
  env->self->send(n, messages::evaluate_atom::value, eval_request(source));
  env->run_messages();
  auto first = next_reply();
  ASSERT_TRUE(first.arrived && first.value) << caf::to_string(first.error);
  auto r1msg = open_result(*first.value);
  auto r1 = r1msg->root<schema::EvalResult>();
  EXPECT_TRUE(r1.getCorrect());
  EXPECT_FALSE(r1.getCached());
  EXPECT_EQ(r1.getKey().size(), 64u);
  EXPECT_EQ(std::string(r1.getBackend().cStr()), "model");
  EXPECT_EQ(store->size(), 1u);

  // The same source (trailing whitespace differs, another candidate id): the node answers
  // while handling the request itself; nothing is sent to the pool.
  request_options o;
  o.candidate_id = "another-candidate";
  env->self->send(n, messages::evaluate_atom::value, eval_request(source + "   \n\n", o));
  ASSERT_TRUE(env->sched.prioritize(n));
  env->sched.run_once();
  EXPECT_FALSE(env->sched.has_job()) << "the store hit reached another actor";
  auto second = next_reply();
  ASSERT_TRUE(second.arrived && second.value) << caf::to_string(second.error);
  auto r2msg = open_result(*second.value);
  auto r2 = r2msg->root<schema::EvalResult>();
  EXPECT_TRUE(r2.getCached());
  EXPECT_EQ(std::string(r2.getKey().cStr()), std::string(r1.getKey().cStr()));
  EXPECT_EQ(std::string(r2.getCandidateId().cStr()), "another-candidate");
  EXPECT_EQ(r2.getCorrect(), r1.getCorrect());
  ASSERT_EQ(r2.getPhases().size(), r1.getPhases().size());
  EXPECT_EQ(r2.getProfile().getTimeUs(), r1.getProfile().getTimeUs());

  std::optional<messages::decoded_message> keep;
  auto ni = info(n, keep);
  EXPECT_EQ(ni.getCacheHits(), 1u);
  EXPECT_EQ(ni.getEvaluations(), 1u);
}

TEST_F(TpuNode, FullQueueRefusesAtOnceWithOverloaded) {
  auto cfg = config();
  cfg.queue_capacity = 1;
  auto n = node(cfg);
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error));
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error + "\n# 2\n"));
  run_only(n);  // the first goes to the pool (not run), the second finds the queue full

  auto refused = next_reply();
  ASSERT_TRUE(refused.arrived);
  ASSERT_FALSE(refused.value);
  EXPECT_EQ(messages::code_of(refused.error), error_code::overloaded);
  EXPECT_NE(messages::message_of(refused.error).find("capacity 1"), std::string::npos)
    << messages::message_of(refused.error);
  EXPECT_FALSE(next_reply().arrived);

  env->run_messages();  // the pool and worker serve the first
  auto served = next_reply();
  ASSERT_TRUE(served.arrived && served.value) << caf::to_string(served.error);
  auto msg = open_result(*served.value);
  EXPECT_EQ(phase(msg->root<schema::EvalResult>(), schema::Phase::LOAD).getErrorClass(),
            schema::ErrorClass::LOAD_ERROR);

  std::optional<messages::decoded_message> keep;
  auto ni = info(n, keep);
  EXPECT_EQ(ni.getRefused(), 1u);
  EXPECT_EQ(ni.getQueueDepth(), 0u);
  EXPECT_EQ(ni.getQueueCapacity(), 1u);
}

TEST_F(TpuNode, DeadlinePassedIsATimeoutErrorAndTheLateResultIsStillRecorded) {
  std::string err;
  auto store = search::evaluation_store::open(":memory:", err);
  ASSERT_TRUE(store) << err;
  auto n = node(config(store.get()));
  auto source = syntax_error + "\n# deadline\n";
  env->self->send(n, messages::evaluate_atom::value, eval_request(source), uint32_t{2000});
  run_only(n);  // at the pool, not run yet
  env->advance_time(1999ms);
  run_only(n);
  EXPECT_FALSE(next_reply().arrived);
  env->advance_time(1ms);
  run_only(n);
  auto late = next_reply();
  ASSERT_TRUE(late.arrived);
  ASSERT_FALSE(late.value);
  EXPECT_EQ(messages::code_of(late.error), error_code::worker_timeout);
  EXPECT_NE(messages::message_of(late.error).find("within 2 s"), std::string::npos)
    << messages::message_of(late.error);

  // The job still runs; its result is a real one, recorded, but nobody is answered twice.
  std::optional<messages::decoded_message> keep;
  EXPECT_EQ(info(n, keep).getQueueDepth(), 1u);
  env->run_messages();
  EXPECT_FALSE(next_reply().arrived);
  EXPECT_EQ(store->size(), 1u);
  auto ni = info(n, keep);
  EXPECT_EQ(ni.getTimeouts(), 1u);
  EXPECT_EQ(ni.getQueueDepth(), 0u);
}

TEST_F(TpuNode, SimulatedDeviceTimeDelaysEachEvaluationInTurn) {
  auto cfg = config();
  cfg.simulate_device = 500ms;
  auto n = node(cfg);
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error + "\n# a\n"));
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error + "\n# b\n"));
  env->run_messages();  // both evaluated; the replies wait for the simulated device
  EXPECT_FALSE(next_reply().arrived);
  env->advance_time(499ms);
  env->run_messages();
  EXPECT_FALSE(next_reply().arrived);
  env->advance_time(1ms);
  env->run_messages();
  auto a = next_reply();
  ASSERT_TRUE(a.arrived && a.value) << caf::to_string(a.error);
  EXPECT_FALSE(next_reply().arrived);  // the device runs one evaluation at a time
  env->advance_time(500ms);
  env->run_messages();
  auto b = next_reply();
  ASSERT_TRUE(b.arrived && b.value) << caf::to_string(b.error);
  auto am = open_result(*a.value);
  auto bm = open_result(*b.value);
  EXPECT_NE(std::string(am->root<schema::EvalResult>().getKey().cStr()),
            std::string(bm->root<schema::EvalResult>().getKey().cStr()));
}

// Capacity planning must not depend on the cache: on a simulated device a store hit takes
// its turn on the device like an evaluation, without reaching the pool.
TEST_F(TpuNode, SimulatedDeviceTimeAppliesToStoreHits) {
  std::string err;
  auto store = search::evaluation_store::open(":memory:", err);
  ASSERT_TRUE(store) << err;
  auto cfg = config(store.get());
  cfg.simulate_device = 500ms;
  auto n = node(cfg);
  auto source = test_kernel("syntax_error") + "\n# stored\n";
  env->self->send(n, messages::evaluate_atom::value, eval_request(source));
  env->run_messages();
  env->advance_time(500ms);
  env->run_messages();
  auto first = next_reply();
  ASSERT_TRUE(first.arrived && first.value) << caf::to_string(first.error);
  EXPECT_FALSE(open_result(*first.value)->root<schema::EvalResult>().getCached());
  ASSERT_EQ(store->size(), 1u);

  // Two repeats: both hits, answered one device slot after the other.
  env->self->send(n, messages::evaluate_atom::value, eval_request(source));
  env->self->send(n, messages::evaluate_atom::value, eval_request(source));
  run_only(n);
  EXPECT_FALSE(env->sched.has_job()) << "a store hit reached another actor";
  EXPECT_FALSE(next_reply().arrived);
  env->advance_time(499ms);
  env->run_messages();
  EXPECT_FALSE(next_reply().arrived);
  env->advance_time(1ms);
  env->run_messages();
  auto a = next_reply();
  ASSERT_TRUE(a.arrived && a.value) << caf::to_string(a.error);
  EXPECT_TRUE(open_result(*a.value)->root<schema::EvalResult>().getCached());
  EXPECT_FALSE(next_reply().arrived);
  env->advance_time(500ms);
  env->run_messages();
  auto b = next_reply();
  ASSERT_TRUE(b.arrived && b.value) << caf::to_string(b.error);
  EXPECT_TRUE(open_result(*b.value)->root<schema::EvalResult>().getCached());

  std::optional<messages::decoded_message> keep;
  auto ni = info(n, keep);
  EXPECT_EQ(ni.getEvaluations(), 1u);
  EXPECT_EQ(ni.getCacheHits(), 2u);
  EXPECT_EQ(ni.getQueueDepth(), 0u);
}

TEST_F(TpuNode, InfoDescribesTheNodeAndItsPool) {
  auto cfg = config();
  cfg.node_id = "host-a:3";
  cfg.device = 3;
  cfg.chip = "v5e";
  cfg.queue_capacity = 7;
  cfg.simulate_device = 20ms;
  auto n = node(cfg);
  std::optional<messages::decoded_message> keep;
  auto ni = info(n, keep);
  EXPECT_EQ(std::string(ni.getNodeId().cStr()), "host-a:3");
  EXPECT_EQ(ni.getDevice(), 3u);
  EXPECT_EQ(std::string(ni.getChip().cStr()), "v5e");
  EXPECT_EQ(std::string(ni.getBackend().cStr()), "model");
  EXPECT_EQ(ni.getQueueCapacity(), 7u);
  EXPECT_EQ(ni.getQueueDepth(), 0u);
  EXPECT_EQ(ni.getSimulatedDeviceMs(), 20u);
  EXPECT_EQ(ni.getWorkers(), 1u);
  EXPECT_EQ(ni.getWorkersIdle(), 1u);
  EXPECT_EQ(ni.getWorkersBusy(), 0u);
  EXPECT_EQ(ni.getWorkersRestarting(), 0u);
  EXPECT_EQ(std::string(ni.getJaxVersion().cStr()), "0.10.2");
  EXPECT_EQ(std::string(ni.getPlatform().cStr()), "cpu");
  EXPECT_FALSE(ni.getMaxkernelVersion().size() == 0);
  EXPECT_FALSE(ni.getHost().size() == 0);
  ASSERT_EQ(ni.getWorkerStates().size(), 1u);
  EXPECT_EQ(std::string(ni.getWorkerStates()[0].getState().cStr()), "idle");
  EXPECT_GT(ni.getWorkerStates()[0].getPid(), 0);

  // A request at work: the node counts it, the pool shows its worker busy.
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error + "\n# busy\n"));
  env->self->send(n, messages::info_atom::value);
  run_only(n, shared_pool);  // the worker has the job but does not run it
  auto r = next_reply();
  ASSERT_TRUE(r.arrived && r.value) << caf::to_string(r.error);
  std::string err;
  auto busy = messages::open_payload<schema::NodeInfo>(*r.value, err);
  ASSERT_TRUE(busy) << err;
  EXPECT_EQ(busy->root<schema::NodeInfo>().getQueueDepth(), 1u);
  EXPECT_EQ(busy->root<schema::NodeInfo>().getWorkersBusy(), 1u);
  EXPECT_EQ(std::string(busy->root<schema::NodeInfo>().getWorkerStates()[0].getState().cStr()),
            "busy");
  env->run_messages();
  EXPECT_FALSE(next_reply().arrived);  // 20 ms of simulated device time
  env->advance_time(20ms);
  env->run_messages();
  EXPECT_TRUE(next_reply().arrived);
  EXPECT_EQ(info(n, keep).getEvaluations(), 1u);
}

TEST_F(TpuNode, MalformedRequestIsRefused) {
  auto n = node(config());
  env->self->send(n, messages::evaluate_atom::value, payload{capnp::typeId<schema::EvalRequest>(), "junk"});
  env->run_messages();
  auto r = next_reply();
  ASSERT_TRUE(r.arrived);
  EXPECT_EQ(messages::code_of(r.error), error_code::malformed_message);
}

TEST_F(TpuNode, JaxTpuNodeMeasuresOnlyItsOwnChipAndMustMatchItsPool) {
  auto cfg = config();
  cfg.backend = "jax-tpu";
  cfg.chip = "v5e";
  auto n = node(cfg, {}, /*run=*/false);
  request_options o;
  o.chip = "v6e";
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error, o));
  run_only(n);
  auto other_chip = next_reply();
  ASSERT_TRUE(other_chip.arrived);
  EXPECT_EQ(messages::code_of(other_chip.error), error_code::bad_input);
  EXPECT_NE(messages::message_of(other_chip.error).find("v5e"), std::string::npos);

  env->run_messages();  // the pool answers: it runs the model backend
  o.chip = "v5e";
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error, o));
  env->run_messages();
  auto mismatch = next_reply();
  ASSERT_TRUE(mismatch.arrived);
  EXPECT_EQ(messages::code_of(mismatch.error), error_code::internal);
  EXPECT_NE(messages::message_of(mismatch.error).find("runs model"), std::string::npos)
    << messages::message_of(mismatch.error);
}

TEST_F(TpuNode, RequestsBeforeTheFirstWorkerStartedWaitForIt) {
  tpu_nodes::pool_config pc;
  pc.workers = 1;
  auto fresh = tpu_nodes::spawn_worker_pool(env->sys, pc);
  spawned.push_back(caf::actor_cast<caf::actor>(fresh));
  auto n = node(config(), fresh, /*run=*/false);
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error + "\n# early\n"));
  env->self->send(fresh, messages::info_atom::value);
  run_only(n, fresh);  // the node waits for the version; the worker has not started
  auto starting = next_reply();
  ASSERT_TRUE(starting.arrived && starting.value) << caf::to_string(starting.error);
  std::string err;
  auto pool_info = messages::open_payload<schema::NodeInfo>(*starting.value, err);
  ASSERT_TRUE(pool_info) << err;
  EXPECT_EQ(std::string(pool_info->root<schema::NodeInfo>().getWorkerStates()[0].getState().cStr()),
            "starting");
  EXPECT_EQ(std::string(pool_info->root<schema::NodeInfo>().getJaxVersion().cStr()), "");
  EXPECT_FALSE(next_reply().arrived);
  env->run_messages();  // the worker starts, then serves the request
  auto r = next_reply();
  ASSERT_TRUE(r.arrived && r.value) << caf::to_string(r.error);
}

TEST_F(TpuNode, PoolHandsQueuedJobsToFreeWorkersInArrivalOrder) {
  tpu_nodes::pool_config pc;
  pc.workers = 2;
  auto two = tpu_nodes::spawn_worker_pool(env->sys, pc);
  spawned.push_back(caf::actor_cast<caf::actor>(two));
  env->run_messages();  // both workers start
  for (auto id : {"first", "second", "third"}) {
    request_options o;
    o.candidate_id = id;
    env->self->send(two, messages::evaluate_atom::value,
                    eval_request(syntax_error + "\n# " + id + "\n", o), uint32_t{60000});
  }
  env->self->send(two, messages::info_atom::value);
  run_only(two);  // two jobs go to the two workers, the third waits
  auto r = next_reply();
  ASSERT_TRUE(r.arrived && r.value) << caf::to_string(r.error);
  std::string err;
  auto pool_info = messages::open_payload<schema::NodeInfo>(*r.value, err);
  ASSERT_TRUE(pool_info) << err;
  auto pi = pool_info->root<schema::NodeInfo>();
  EXPECT_EQ(pi.getWorkers(), 2u);
  EXPECT_EQ(pi.getWorkersBusy(), 2u);
  EXPECT_EQ(pi.getQueueDepth(), 1u);

  env->run_messages();
  std::vector<std::string> order;
  for (int i = 0; i < 3; ++i) {
    auto done = next_reply();
    ASSERT_TRUE(done.arrived && done.value) << caf::to_string(done.error);
    auto msg = open_result(*done.value);
    order.push_back(msg->root<schema::EvalResult>().getCandidateId().cStr());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second", "third"}));
  std::optional<messages::decoded_message> keep;
  auto after = info(two, keep);
  EXPECT_EQ(after.getEvaluations(), 3u);
  EXPECT_EQ(after.getWorkerStates()[0].getEvaluations() + after.getWorkerStates()[1].getEvaluations(), 3u);
  EXPECT_EQ(after.getWorkersIdle(), 2u);
}

TEST_F(TpuNode, WorkerThatCannotStartIsRetriedWithCappedBackoff) {
  tpu_nodes::pool_config pc;
  pc.workers = 1;
  pc.worker.python = "/nonexistent/python3";
  pc.backoff_initial = 1s;
  pc.backoff_max = 4s;
  auto broken = tpu_nodes::spawn_worker_pool(env->sys, pc);
  spawned.push_back(caf::actor_cast<caf::actor>(broken));
  env->run_messages();

  std::optional<messages::decoded_message> keep;
  auto ni = info(broken, keep);
  EXPECT_EQ(ni.getWorkersRestarting(), 1u);
  auto w = ni.getWorkerStates()[0];
  EXPECT_EQ(std::string(w.getState().cStr()), "restarting");
  EXPECT_EQ(w.getStartFailures(), 1u);
  EXPECT_EQ(w.getRetryInMs(), 1000u);
  EXPECT_NE(std::string(w.getLastError().cStr()).find("/nonexistent/python3"), std::string::npos);

  // Nothing waits for a pool without workers: the job is refused at once.
  env->self->send(broken, messages::evaluate_atom::value, eval_request(syntax_error), uint32_t{60000});
  run_only(broken);
  auto r = next_reply();
  ASSERT_TRUE(r.arrived);
  EXPECT_EQ(messages::code_of(r.error), error_code::worker_unavailable);
  EXPECT_NE(messages::message_of(r.error).find("does not exist"), std::string::npos);

  // And so is an evaluation at a node in front of it.
  auto n = node(config(), broken);
  env->self->send(n, messages::evaluate_atom::value, eval_request(syntax_error));
  env->run_messages();
  auto via_node = next_reply();
  ASSERT_TRUE(via_node.arrived);
  EXPECT_EQ(messages::code_of(via_node.error), error_code::worker_unavailable);

  // Backoff 1 s, 2 s, 4 s, then capped at 4 s.
  uint64_t expected[] = {2000, 4000, 4000};
  uint64_t wait = 1000;
  for (unsigned i = 0; i < 3; ++i) {
    env->advance_time(std::chrono::milliseconds(wait - 1));
    env->run_messages();
    EXPECT_EQ(info(broken, keep).getWorkerStates()[0].getStartFailures(), i + 1);
    env->advance_time(1ms);
    env->run_messages();
    auto ws = info(broken, keep).getWorkerStates()[0];
    EXPECT_EQ(ws.getStartFailures(), i + 2);
    EXPECT_EQ(ws.getRetryInMs(), expected[i]);
    wait = expected[i];
  }
}
