// The planner, implementer and debugger actors under CAF's deterministic scheduler: each
// answers its request through its brain chain, a later brain takes over when an earlier one
// has nothing (a chain of two expert brains over different template lists), malformed
// payloads are refused with malformed_message and the actors survive them.
#include "agents/debugger_actor.hpp"
#include "agents/expert/expert_brains.hpp"
#include "agents/implementer_actor.hpp"
#include "agents/planner_actor.hpp"
#include "agents/role_chain.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "messages/payload_codec.hpp"
#include "tests/agents/expert/scale_template.hpp"
#include "tests/support/deterministic_system.hpp"

#include <caf/exit_reason.hpp>
#include <gtest/gtest.h>

#include <optional>

using namespace maxkernel;
using messages::payload;
namespace ex = agents::expert;

namespace {

struct reply {
  bool arrived = false;
  std::optional<payload> value;
  caf::error error;
};

class RoleActors : public ::testing::Test {
protected:
  std::vector<ex::template_ptr> scale{std::make_shared<tests::scale_template>()};

  template <class Actor, class Atom>
  reply ask(const Actor& a, Atom atom, const payload& p) {
    env.self->send(a, atom, p);
    env.run_messages();
    reply r;
    r.arrived = env.receive_now([&](payload& v) { r.value = std::move(v); },
                                [&](caf::error& e) { r.error = std::move(e); });
    return r;
  }

  payload planner_request(const std::string& prim) {
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::PlannerRequest>();
    req.setSchemaVersion(schema::SCHEMA_VERSION);
    req.setChip("v5e");
    tests::build_graph(req.initAnalysis(), prim, 512, 1024);
    return messages::make_payload<schema::PlannerRequest>(msg);
  }

  test_support::deterministic_system env;
};

}  // namespace

TEST_F(RoleActors, PlannerAnswersThroughItsChain) {
  auto planner = agents::spawn_planner(
    env.sys, {ex::make_expert_planner(scale), ex::make_expert_planner(scale)});
  auto r = ask(planner, messages::plan_atom::value, planner_request("mul"));
  ASSERT_TRUE(r.arrived);
  ASSERT_TRUE(r.value) << messages::message_of(r.error);
  std::string err;
  auto msg = messages::open_payload<schema::Plan>(*r.value, err);
  ASSERT_TRUE(msg) << err;
  auto plan = msg->root<schema::Plan>();
  ASSERT_EQ(plan.getSteps().size(), 1u);
  EXPECT_EQ(std::string(plan.getSteps()[0].getTemplate().cStr()), "scale");
  EXPECT_EQ(plan.getSchemaVersion(), schema::SCHEMA_VERSION);

  // No template anywhere in the chain: the last brain's honest answer.
  auto none_found = ask(planner, messages::plan_atom::value, planner_request("exp"));
  ASSERT_TRUE(none_found.value);
  auto m2 = messages::open_payload<schema::Plan>(*none_found.value, err);
  EXPECT_TRUE(m2->root<schema::Plan>().getNoTemplate());

  // Malformed payloads: refused, and the actor keeps serving.
  auto bad = ask(planner, messages::plan_atom::value, payload{capnp::typeId<schema::Plan>(), "x"});
  EXPECT_EQ(messages::code_of(bad.error), messages::error_code::malformed_message);
  auto junk = ask(planner, messages::plan_atom::value,
                  payload{capnp::typeId<schema::PlannerRequest>(), "not capnp"});
  EXPECT_EQ(messages::code_of(junk.error), messages::error_code::malformed_message);
  EXPECT_TRUE(ask(planner, messages::plan_atom::value, planner_request("mul")).value);
  env.self->send_exit(planner, caf::exit_reason::user_shutdown);
  env.run_messages();
}

TEST_F(RoleActors, ImplementerAndDebuggerRoundTrip) {
  auto implementer = agents::spawn_implementer(env.sys, {ex::make_expert_implementer(scale)});
  auto debugger = agents::spawn_debugger(env.sys, {ex::make_expert_debugger(scale)});
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::ImplementRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.setChip("v5e");
  tests::build_graph(req.initAnalysis(), "mul", 512, 1024);
  req.initStep().setMove("template");
  req.getStep().setTemplate("scale");
  auto r = ask(implementer, messages::implement_atom::value,
               messages::make_payload<schema::ImplementRequest>(msg));
  ASSERT_TRUE(r.value) << messages::message_of(r.error);
  std::string err;
  auto cand_msg = messages::open_payload<schema::ImplementReply>(*r.value, err);
  auto cand = cand_msg->root<schema::ImplementReply>().getCandidate();
  EXPECT_EQ(std::string(cand.getTemplate().cStr()), "scale");

  // Unknown chip: bad_input, not a crash.
  req.setChip("v99");
  auto bad_chip = ask(implementer, messages::implement_atom::value,
                      messages::make_payload<schema::ImplementRequest>(msg));
  EXPECT_EQ(messages::code_of(bad_chip.error), messages::error_code::bad_input);

  capnp::MallocMessageBuilder dmsg;
  auto d = dmsg.initRoot<schema::DebugRequest>();
  d.setSchemaVersion(schema::SCHEMA_VERSION);
  d.setChip("v5e");
  d.setAttempt(1);
  d.setMaxAttempts(2);
  tests::build_graph(d.initAnalysis(), "mul", 512, 1024);
  d.setCandidate(cand);
  auto phase = d.initResult().initPhases(1)[0];
  phase.setStatus(schema::Status::FAILED);
  phase.setErrorClass(schema::ErrorClass::VMEM_OOM);
  auto dr = ask(debugger, messages::debug_atom::value,
                messages::make_payload<schema::DebugRequest>(dmsg));
  ASSERT_TRUE(dr.value) << messages::message_of(dr.error);
  auto rep = messages::open_payload<schema::DebugReply>(*dr.value, err);
  auto rr = rep->root<schema::DebugReply>();
  EXPECT_TRUE(rr.getRepaired()) << rr.getReason().cStr();
  EXPECT_EQ(std::string(rr.getCandidate().getParentId().cStr()), std::string(cand.getId().cStr()));
  env.self->send_exit(implementer, caf::exit_reason::user_shutdown);
  env.self->send_exit(debugger, caf::exit_reason::user_shutdown);
  env.run_messages();
}

namespace {

// Reads the whole request over and over, as the expert brains do with the analysis (each
// template's match walks the graph): past the decode's traversal limit in total.
class rereading_planner final : public agents::planner_brain {
public:
  uint64_t words_read = 0;
  std::string name() const override { return "rereading"; }
  agents::brain_status plan(schema::PlannerRequest::Reader request,
                            schema::Plan::Builder out) override {
    constexpr uint64_t limit_words = 8ull * 1024 * 1024;  // messages/capnp_io.cpp
    while (words_read <= 2 * limit_words) {
      uint64_t n = 0;
      for (auto node : request.getAnalysis().getNodes()) {
        // every pointer a brain follows counts: text, lists, their structs
        n += node.getPrimitive().size() / 8 + node.getParams().size() / 8 + 2;
        for (auto t : node.getOperands())
          n += t.getShape().size() + t.getDtype().size() / 8;
        n += node.getOperandIds().size() / 2 + 1;
      }
      words_read += std::max<uint64_t>(n, 1);
    }
    out.setNoTemplate(true);
    out.setMessage("read the request past the traversal limit");
    return {};
  }
};

}  // namespace

// A regression test: a brain that rereads a request more than the traversal limit allows
// in total got malformed_message (a large flash attention backward graph in the planner).
// Through the chain the role actors run (a brain not named "expert" gets a detached actor,
// outside the deterministic scheduler).
TEST_F(RoleActors, BrainsMayRereadARequestPastTheTraversalLimit) {
  auto brain = std::make_shared<rereading_planner>();
  auto r = agents::run_planners({brain}, planner_request("mul"));
  ASSERT_TRUE(std::holds_alternative<payload>(r))
    << messages::message_of(std::get<caf::error>(r));
  EXPECT_GT(brain->words_read, 2 * 8ull * 1024 * 1024);
  std::string err;
  auto msg = messages::open_payload<schema::Plan>(std::get<payload>(r), err);
  ASSERT_TRUE(msg) << err;
  EXPECT_TRUE(msg->root<schema::Plan>().getNoTemplate());
}
