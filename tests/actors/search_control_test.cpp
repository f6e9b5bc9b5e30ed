// An operator's control of a running search (SearchControl: stop, pause, resume, budget)
// through the auto and graph supervisors' actors under CAF's deterministic scheduler (the
// real pool, a stand-in node: supervisor_fixture.hpp). A paused search starts no step until
// it is resumed or stopped; a stop ends it with the reason "operator"; a new budget is the
// cap from then on.
#include "actors/auto_supervisor.hpp"
#include "actors/graph_supervisor.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "tests/actors/supervisor_fixture.hpp"

#include <gtest/gtest.h>

#include <functional>

using namespace maxkernel;
using namespace maxkernel::actors_test;

namespace {

struct control_answer {
  bool answered = false;
  std::optional<messages::decoded_message> progress;
  caf::error error;
  schema::Progress::Reader p() { return progress->root<schema::Progress>(); }
};

class SearchControl : public supervisor_fixture, public ::testing::WithParamInterface<std::string> {
protected:
  messages::supervisor_actor spawn() {
    auto node = caf::actor_cast<messages::tpu_node_actor>(node_actor);
    if (GetParam() == "graph")
      return actors::spawn_graph_supervisor(env.sys, pool, node, {});
    return actors::spawn_auto_supervisor(env.sys, pool, node, {});
  }

  // Sends one control, lets every actor run, and takes the supervisor's answer to it.
  control_answer control(const messages::supervisor_actor& sup,
                         const std::function<void(schema::SearchControl::Builder)>& fill) {
    capnp::MallocMessageBuilder msg;
    fill(msg.initRoot<schema::SearchControl>());
    env.self->send(sup, messages::control_atom::value,
                   messages::make_payload<schema::SearchControl>(msg));
    env.run_messages();
    control_answer a;
    a.answered = env.receive_now(
      [&](payload& p) {
        std::string error;
        a.progress = messages::open_payload<schema::Progress>(p, error);
        EXPECT_TRUE(a.progress) << error;
      },
      [&](caf::error& e) { a.error = std::move(e); });
    return a;
  }

  static void pause(schema::SearchControl::Builder c) { c.setPause(); }
  static void resume(schema::SearchControl::Builder c) { c.setResume(); }
  static std::function<void(schema::SearchControl::Builder)> budget(uint32_t n) {
    return [n](schema::SearchControl::Builder c) { c.setBudgetEvals(n); };
  }
  static std::function<void(schema::SearchControl::Builder)> stop(std::string why) {
    return [why](schema::SearchControl::Builder c) { c.setStop(why); };
  }
};

}  // namespace

// Paused before its first step, the search asks the node nothing until it is resumed; the
// budget raised meanwhile is the one it ends on.
TEST_P(SearchControl, APausedSearchWaitsForResumeAndEndsOnTheNewBudget) {
  auto sup = spawn();
  start(sup, {.mode = GetParam(), .budget = 2});
  auto paused = control(sup, pause);
  ASSERT_TRUE(paused.progress) << messages::message_of(paused.error);
  EXPECT_TRUE(paused.p().getPaused());
  drive();
  EXPECT_EQ(node->requests, 0u);
  EXPECT_FALSE(answer().answered);

  auto raised = control(sup, budget(3));
  ASSERT_TRUE(raised.progress) << messages::message_of(raised.error);
  EXPECT_EQ(raised.p().getBudgetEvals(), 3u);
  EXPECT_EQ(node->requests, 0u);

  auto resumed = control(sup, resume);
  ASSERT_TRUE(resumed.progress) << messages::message_of(resumed.error);
  EXPECT_FALSE(resumed.p().getPaused());
  drive();
  auto o = answer();
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_EQ(std::string(o.r().getStopReason().cStr()), "budget");
  EXPECT_EQ(o.r().getCandidatesEvaluated(), 3u);
  EXPECT_GT(node->requests, 0u);
}

// A stop of a paused search ends it at once, with what it has (nothing here).
TEST_P(SearchControl, StoppingAPausedSearchEndsItWithTheOperatorsReason) {
  auto sup = spawn();
  start(sup, {.mode = GetParam(), .budget = 4});
  ASSERT_TRUE(control(sup, pause).progress);
  drive();
  auto stopped = control(sup, stop("enough"));
  ASSERT_TRUE(stopped.progress) << messages::message_of(stopped.error);
  EXPECT_NE(std::string(stopped.p().getMessage().cStr()).find("enough"), std::string::npos);
  drive();
  auto o = answer();
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_EQ(std::string(o.r().getStopReason().cStr()), "operator");
  EXPECT_EQ(o.r().getCandidatesEvaluated(), 0u);
  EXPECT_EQ(node->requests, 0u);
}

// A stop while candidates are out lets them finish, then ends the search: nothing in flight
// is lost, and no further step starts.
TEST_P(SearchControl, AStopWhileCandidatesAreOutEndsAfterThem) {
  node->order = answer_order::forward;  // answers wait for a release
  auto sup = spawn();
  start(sup, {.mode = GetParam(), .budget = 8});
  env.run_messages();
  ASSERT_FALSE(node->held.empty());
  unsigned asked = node->requests;
  ASSERT_TRUE(control(sup, stop("")).progress);
  drive();
  auto o = answer();
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_EQ(std::string(o.r().getStopReason().cStr()), "operator");
  EXPECT_GE(o.r().getCandidatesEvaluated(), 1u);
  EXPECT_LT(o.r().getCandidatesEvaluated(), 8u);
  for (auto v : o.r().getVertices())
    EXPECT_EQ(v.getState(), schema::VertexState::EVALUATED);
  // Only the held candidates and their own follow-ups (the tester's cases) were asked.
  EXPECT_GE(node->requests, asked);
}

// A budget below what is done ends the search at its next step; a budget of 0 that would
// leave it without an end is refused and changes nothing.
TEST_P(SearchControl, ALoweredBudgetEndsTheSearchAndAnEndlessOneIsRefused) {
  node->order = answer_order::forward;
  auto sup = spawn();
  start(sup, {.mode = GetParam(), .budget = 8});
  env.run_messages();
  auto endless = control(sup, budget(0));
  EXPECT_FALSE(endless.progress);
  EXPECT_EQ(messages::code_of(endless.error), messages::error_code::bad_input);
  EXPECT_NE(messages::message_of(endless.error).find("without an end"), std::string::npos);
  auto lowered = control(sup, budget(1));
  ASSERT_TRUE(lowered.progress) << messages::message_of(lowered.error);
  drive();
  auto o = answer();
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_EQ(std::string(o.r().getStopReason().cStr()), "budget");
  EXPECT_LT(o.r().getCandidatesEvaluated(), 8u);
}

// Without a search there is nothing to control: a clear error, not a crash or a hang.
TEST_P(SearchControl, AnIdleSupervisorRefusesControls) {
  auto sup = spawn();
  to_stop.push_back(caf::actor_cast<caf::actor>(sup));
  auto a = control(sup, pause);
  EXPECT_FALSE(a.progress);
  EXPECT_EQ(messages::code_of(a.error), messages::error_code::bad_input);
  EXPECT_NE(messages::message_of(a.error).find("no search is running"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Modes, SearchControl, ::testing::Values("auto", "graph"));
