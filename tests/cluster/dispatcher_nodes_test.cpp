// The dispatcher in front of real tpu_nodes: two model-backend nodes with simulated device
// time sharing one worker pool (one real JAX worker), on CAF's real scheduler. A handful of
// evaluations sent at once all come back, each to its own candidate, with the verdicts the
// worker gives. The test links tpu_nodes/; cluster/ itself never includes it.
#include "cluster/dispatcher.hpp"
#include "maxkernel/schema/cluster.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"
#include "tests/support/eval_requests.hpp"
#include "tpu_nodes/tpu_node.hpp"
#include "tpu_nodes/worker_pool.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <gtest/gtest.h>

#include <map>
#include <string>

using namespace maxkernel;
using namespace std::chrono_literals;
using messages::error_code;
using messages::payload;
using test_support::eval_request;
using test_support::request_options;
using test_support::test_kernel;

namespace {

struct outcome {
  bool correct = false;
  bool lowered = false;
  caf::error error;
};

request_options as(const std::string& id, const std::string& chip = "") {
  request_options o;
  o.candidate_id = id;
  o.chip = chip;
  return o;
}

}  // namespace

TEST(DispatcherNodes, TwoNodesSharingAPoolAnswerEveryEvaluation) {
  caf::actor_system_config cfg;
  messages::register_types(cfg);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  tpu_nodes::pool_config pc;
  pc.workers = 1;
  auto pool = tpu_nodes::spawn_worker_pool(sys, pc);
  std::vector<messages::tpu_node_actor> nodes;
  for (unsigned i = 0; i < 2; ++i) {
    tpu_nodes::node_config nc;
    nc.node_id = "int:" + std::to_string(i);
    nc.device = i;
    nc.simulate_device = 300ms;
    nodes.push_back(tpu_nodes::spawn_tpu_node(sys, nc, pool));
  }
  auto d = cluster::spawn_dispatcher(sys, nodes);

  auto matmul = test_kernel("matmul");
  std::map<std::string, payload> requests{
    {"k1", eval_request(matmul, as("k1"))},
    {"k2", eval_request(test_kernel("matmul_off_by_one"), as("k2"))},
    {"k3", eval_request(test_kernel("syntax_error"), as("k3"))},
    {"k4", eval_request(matmul + "\n# another source\n", as("k4"))},
    {"k5", eval_request(matmul + "\n# v9z\n", as("k5", "v9z"))},
  };
  for (auto& [id, request] : requests)
    self->send(d, messages::evaluate_atom::value, request, uint32_t{120'000});

  std::map<std::string, outcome> got;
  std::vector<caf::error> errors;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    bool timed_out = false;
    self->receive(
      [&](payload& p) {
        std::string err;
        auto msg = messages::open_payload<schema::EvalResult>(p, err);
        ASSERT_TRUE(msg) << err;
        auto r = msg->root<schema::EvalResult>();
        outcome o;
        o.correct = r.getCorrect();
        for (auto ph : r.getPhases())
          if (ph.getPhase() == schema::Phase::LOWER)
            o.lowered = ph.getStatus() == schema::Status::OK;
        got[r.getCandidateId()] = o;
      },
      [&](caf::error& e) { errors.push_back(e); },
      caf::after(180s) >> [&] { timed_out = true; });
    ASSERT_FALSE(timed_out) << "no answer " << i + 1;
  }

  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got["k1"].correct);
  EXPECT_TRUE(got["k4"].correct);
  EXPECT_FALSE(got["k2"].correct);
  EXPECT_TRUE(got["k2"].lowered);
  EXPECT_FALSE(got["k3"].correct);
  EXPECT_FALSE(got["k3"].lowered);
  // The unknown chip is the node's error, passed to the requester as it is.
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(messages::code_of(errors[0]), error_code::bad_input);
  EXPECT_NE(messages::message_of(errors[0]).find("v9z"), std::string::npos)
    << messages::message_of(errors[0]);

  std::optional<messages::decoded_message> status;
  self->request(d, 60s, messages::status_atom::value)
    .receive(
      [&](payload& p) {
        std::string err;
        status = messages::open_payload<schema::DispatcherStatus>(p, err);
        EXPECT_TRUE(status) << err;
      },
      [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  ASSERT_TRUE(status);
  auto s = status->root<schema::DispatcherStatus>();
  EXPECT_EQ(s.getCompleted(), 5u);
  EXPECT_EQ(s.getQueued(), 0u);
  EXPECT_EQ(s.getInFlight(), 0u);
  EXPECT_EQ(s.getRequeued(), 0u);
  ASSERT_EQ(s.getNodes().size(), 2u);
  for (unsigned i = 0; i < 2; ++i) {
    auto n = s.getNodes()[i];
    EXPECT_EQ(std::string(n.getNodeId().cStr()), "int:" + std::to_string(i));
    EXPECT_TRUE(n.getAlive());
    EXPECT_GE(n.getCompleted(), 1u) << "node " << i << " got no work";
    EXPECT_EQ(n.getInFlight(), 0u);
  }

  self->send_exit(d, caf::exit_reason::user_shutdown);
  for (auto& n : nodes)
    self->send_exit(n, caf::exit_reason::user_shutdown);
  self->send_exit(pool, caf::exit_reason::user_shutdown);
}
