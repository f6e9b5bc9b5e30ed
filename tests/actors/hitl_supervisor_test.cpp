// The hitl supervisor through its actors under CAF's deterministic scheduler: the real pool over
// the recorded rmsnorm_3d analysis, a stand-in node and a scripted operator
// (supervisor_fixture.hpp). Every decision kind, the timeout policies (the test clock moved past
// operatorTimeoutSeconds), the transcript, the Proposal's fields, and a resumed search asking
// again for the proposal it was waiting on without evaluating anything again.
#include "actors/hitl_supervisor.hpp"
#include "messages/error.hpp"
#include "search/temp_dir.hpp"
#include "tests/actors/supervisor_fixture.hpp"

#include <caf/exit_reason.hpp>
#include <gtest/gtest.h>

#include <sstream>

using namespace maxkernel;
using namespace maxkernel::actors_test;
using schema::DecisionKind;
using namespace std::chrono_literals;

namespace {

class HitlSupervisor : public supervisor_fixture {
protected:
  messages::supervisor_actor spawn() {
    return actors::spawn_hitl_supervisor(env.sys, pool,
                                         caf::actor_cast<messages::tpu_node_actor>(node_actor),
                                         messages::progress_listener_actor{}, operator_actor);
  }
  void script(std::initializer_list<scripted_decision> ds) {
    op->script.insert(op->script.end(), ds.begin(), ds.end());
  }
  static search_settings hitl() { return {.mode = "hitl", .budget = 0}; }
};

scripted_decision edit(std::vector<std::pair<std::string, std::string>> changes) {
  auto d = decision(DecisionKind::EDIT);
  d.changes = std::move(changes);
  return d;
}
scripted_decision with_source(DecisionKind kind, std::string source) {
  auto d = decision(kind);
  d.source = std::move(source);
  return d;
}
scripted_decision hand_over(uint32_t steps) {
  auto d = decision(DecisionKind::HAND_OVER);
  d.steps = steps;
  return d;
}

const char* operator_kernel = R"(import jax
import jax.numpy as jnp

def workload(x, weight, eps):
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * r * weight.astype(jnp.float32)).astype(x.dtype)
)";

std::string text(capnp::Text::Reader t) { return t.cStr(); }

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);)
    out.push_back(l);
  return out;
}

bool has_line(const std::string& source, const std::string& line) {
  for (const auto& l : lines(source))
    if (l == line)
      return true;
  return false;
}

std::string param(schema::Candidate::Reader c, const std::string& name) {
  for (auto p : c.getParams())
    if (p.getName() == name.c_str())
      return p.getValue().cStr();
  return "";
}

unsigned evaluations_of(schema::OptimizeResult::Reader r) {
  unsigned n = 0;
  for (auto v : r.getVertices())
    n += v.getEvaluations();
  return n;
}

}  // namespace

// approve -> the next proposal (planned from the best accepted); stop -> the search ends with
// stop reason "operator". The Proposal's fields and the transcript on the way.
TEST_F(HitlSupervisor, ApproveProposesTheNextStopEnds) {
  script({approve(), approve(), decision(DecisionKind::STOP, "enough")});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.answered);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  EXPECT_EQ(text(r.getStopReason()), "operator");
  ASSERT_EQ(op->proposals.size(), 3u);
  ASSERT_EQ(r.getVertices().size(), 3u);
  EXPECT_EQ(text(r.getVertices()[0].getDecision()), "approved");
  EXPECT_EQ(text(r.getVertices()[1].getDecision()), "approved");
  EXPECT_EQ(text(r.getVertices()[2].getDecision()), "stopped");
  EXPECT_EQ(text(r.getVertices()[2].getFeedback()), "enough");
  EXPECT_EQ(node->requests, evaluations_of(r));

  for (unsigned k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    auto p = op->proposal(k);
    auto v = r.getVertices()[k];
    EXPECT_EQ(p.getSeq(), k + 1);
    EXPECT_EQ(p.getVertex().getIndex(), k);
    EXPECT_EQ(text(p.getTask()), "rmsnorm_3d");
    EXPECT_EQ(text(p.getChip()), "v6e");
    EXPECT_EQ(text(p.getTiming()), "modeled");
    EXPECT_EQ(p.getEvaluations(), k + 1);  // this candidate is evaluated when proposed
    EXPECT_EQ(p.getBudgetEvals(), 0u);
    EXPECT_EQ(p.getAutoSteps(), 0u);
    EXPECT_DOUBLE_EQ(p.getReferenceTimeUs(), 100);
    EXPECT_EQ(text(p.getVertex().getDecision()), "awaiting");
    EXPECT_EQ(text(p.getVertex().getCandidate().getId()), text(v.getCandidate().getId()));
    EXPECT_TRUE(p.getVertex().getHasResult());
    EXPECT_TRUE(p.getVertex().getHasDiagnosis());
    EXPECT_DOUBLE_EQ(p.getVertex().getTimeUs(), v.getTimeUs());
    EXPECT_FALSE(p.getDiff().size() == 0);
    // the planner's expected effect of the step
    EXPECT_FALSE(p.getExpectedEffect().size() == 0);
    EXPECT_EQ(text(p.getExpectedEffect()), text(v.getExpectedEffect()));
  }
  // The first is diffed against nothing; every line of its kernel is added.
  auto p1 = op->proposal(0);
  EXPECT_EQ(p1.getBestIndex(), -1);
  EXPECT_DOUBLE_EQ(p1.getParentTimeUs(), 0);
  EXPECT_EQ(p1.getVertex().getParent(), -1);
  auto d1 = lines(text(p1.getDiff()));
  ASSERT_GE(d1.size(), 3u);
  EXPECT_EQ(d1[0], "--- (nothing)");
  EXPECT_EQ(d1[1], "+++ vertex 0");
  // The second moves from the first (the only accepted one): diffed against it.
  auto p2 = op->proposal(1);
  EXPECT_EQ(p2.getVertex().getParent(), 0);
  EXPECT_EQ(p2.getBestIndex(), 0);
  EXPECT_DOUBLE_EQ(p2.getBestTimeUs(), r.getVertices()[0].getTimeUs());
  EXPECT_DOUBLE_EQ(p2.getParentTimeUs(), r.getVertices()[0].getTimeUs());
  std::string parent_src = r.getVertices()[0].getCandidate().getSource().cStr();
  std::string child_src = r.getVertices()[1].getCandidate().getSource().cStr();
  auto d2 = lines(text(p2.getDiff()));
  ASSERT_GE(d2.size(), 4u);
  EXPECT_EQ(d2[0], "--- vertex 0");
  EXPECT_EQ(d2[1], "+++ vertex 1");
  unsigned removed = 0, added = 0;
  for (size_t i = 2; i < d2.size(); ++i) {
    const auto& l = d2[i];
    if (l.rfind("@@", 0) == 0 || l.empty())
      continue;
    if (l[0] == '-') {
      ++removed;
      EXPECT_TRUE(has_line(parent_src, l.substr(1))) << l;
    } else if (l[0] == '+') {
      ++added;
      EXPECT_TRUE(has_line(child_src, l.substr(1))) << l;
    }
  }
  EXPECT_GT(removed, 0u);
  EXPECT_GT(added, 0u);
  EXPECT_LT(d2.size(), lines(child_src).size());  // a diff, not the whole kernel again
  // The third moves from the best accepted of the two.
  int best = r.getVertices()[1].getTimeUs() < r.getVertices()[0].getTimeUs() ? 1 : 0;
  EXPECT_EQ(op->proposal(2).getBestIndex(), best);
  EXPECT_EQ(op->proposal(2).getVertex().getParent(), best);
  EXPECT_EQ(r.getBest(), best);  // the stopped one is no candidate for the best

  // The transcript: each proposal then its decision, with matching seqs; the end last.
  auto t = transcript(r);
  ASSERT_EQ(t.size(), 7u);
  DecisionKind kinds[] = {DecisionKind::APPROVE, DecisionKind::APPROVE, DecisionKind::STOP};
  for (unsigned k = 0; k < 3; ++k) {
    auto pe = t[2 * k].root<schema::TranscriptEntry>();
    auto de = t[2 * k + 1].root<schema::TranscriptEntry>();
    ASSERT_TRUE(pe.isProposal());
    ASSERT_TRUE(de.isDecision());
    EXPECT_EQ(pe.getSeq(), k + 1);
    EXPECT_EQ(pe.getProposal().getSeq(), k + 1);
    EXPECT_EQ(pe.getProposal().getVertex().getIndex(), k);
    EXPECT_EQ(de.getSeq(), k + 1);
    EXPECT_EQ(de.getDecision().getSeq(), k + 1);
    EXPECT_EQ(de.getDecision().getKind(), kinds[k]);
    EXPECT_EQ(text(de.getDecision().getOperator()), "ana");
    EXPECT_GE(de.getTimeUnixMs(), pe.getTimeUnixMs());
  }
  auto last = t[6].root<schema::TranscriptEntry>();
  ASSERT_TRUE(last.isNote());
  EXPECT_NE(text(last.getNote()).find("operator"), std::string::npos) << text(last.getNote());
  // The shells were told that it ended.
  ASSERT_FALSE(op->events.empty());
  EXPECT_TRUE(op->event(op->events.size() - 1).isEnded());
}

// reject with feedback: the vertex is "rejected", never the best (even when it is the fastest)
// nor a parent, and the feedback is in the next PlannerRequest's guidance. (The chain on this
// task: a first kernel, a slower growBlock, then a faster shrinkBlock, which is rejected.)
TEST_F(HitlSupervisor, RejectedIsNeverTheBestAndItsFeedbackReachesThePlanner) {
  auto guidance = spy_on_planner();
  const std::string feedback = "no: keep the row blocks as they were";
  script({approve(), approve(), decision(DecisionKind::REJECT, feedback),
          decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  ASSERT_GE(r.getVertices().size(), 3u);
  auto v0 = r.getVertices()[0], v1 = r.getVertices()[1], v2 = r.getVertices()[2];
  EXPECT_EQ(text(v2.getDecision()), "rejected");
  EXPECT_EQ(text(v2.getFeedback()), feedback);
  EXPECT_TRUE(v2.getCorrect());  // correct, and still not accepted
  // the fastest of all, so only the rejection keeps it from being the best
  ASSERT_LT(v2.getTimeUs(), v0.getTimeUs());
  ASSERT_LT(v2.getTimeUs(), v1.getTimeUs());
  ASSERT_LT(v0.getTimeUs(), v1.getTimeUs());
  EXPECT_EQ(r.getBest(), 0);
  for (auto v : r.getVertices())
    EXPECT_NE(v.getParent(), 2);
  // The planner was asked once per proposal and once after the rejection; the guidance
  // holds the feedback from then on.
  ASSERT_GE(guidance->size(), 4u);
  for (size_t k = 0; k < 3; ++k)
    EXPECT_TRUE((*guidance)[k].empty()) << k;
  ASSERT_EQ((*guidance)[3].size(), 1u);
  EXPECT_NE((*guidance)[3][0].find(feedback), std::string::npos) << (*guidance)[3][0];
  EXPECT_NE((*guidance)[3][0].find("rejected vertex 2"), std::string::npos) << (*guidance)[3][0];
  if (op->proposals.size() == 4) {  // the planner had another move from the best accepted
    EXPECT_EQ(op->proposal(3).getBestIndex(), 0);
    EXPECT_EQ(op->proposal(3).getVertex().getParent(), 0);
    EXPECT_EQ(text(r.getStopReason()), "operator");
  } else {
    EXPECT_EQ(op->proposals.size(), 3u);
    EXPECT_EQ(text(r.getStopReason()), "exhausted");
  }
}

// hint: the proposal is accepted and the text steers the next plans.
TEST_F(HitlSupervisor, HintApprovesAndGuides) {
  auto guidance = spy_on_planner();
  const std::string h = "prefer fewer, larger row blocks";
  script({decision(DecisionKind::HINT, h), decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  ASSERT_EQ(r.getVertices().size(), 2u);
  EXPECT_EQ(text(r.getVertices()[0].getDecision()), "approved");
  EXPECT_EQ(text(r.getVertices()[0].getFeedback()), h);
  EXPECT_EQ(r.getVertices()[1].getParent(), 0);  // accepted: a parent
  EXPECT_EQ(op->proposal(1).getBestIndex(), 0);
  ASSERT_EQ(guidance->size(), 2u);
  EXPECT_TRUE((*guidance)[0].empty());
  EXPECT_EQ((*guidance)[1], std::vector<std::string>{h});
}

// edit with parameters: the implementer re-renders the proposal with them; the new kernel is a
// vertex whose parent is the proposal, evaluated and proposed; the proposal is "edited".
TEST_F(HitlSupervisor, EditByParametersIsEvaluatedAndProposed) {
  script({edit({{"block_rows", "128"}}), approve(), decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  ASSERT_GE(op->proposals.size(), 2u);
  auto first = op->proposal(0).getVertex();
  ASSERT_NE(param(first.getCandidate(), "block_rows"), "");
  ASSERT_NE(param(first.getCandidate(), "block_rows"), "128");
  auto p2 = op->proposal(1);
  EXPECT_EQ(p2.getSeq(), 2u);
  EXPECT_EQ(p2.getVertex().getIndex(), 1u);
  EXPECT_EQ(p2.getVertex().getParent(), 0);
  EXPECT_EQ(param(p2.getVertex().getCandidate(), "block_rows"), "128");
  EXPECT_EQ(text(p2.getVertex().getCandidate().getParentId()), text(first.getCandidate().getId()));
  EXPECT_EQ(text(p2.getVertex().getCandidate().getTemplate()),
            text(first.getCandidate().getTemplate()));
  EXPECT_DOUBLE_EQ(p2.getParentTimeUs(), first.getTimeUs());
  EXPECT_EQ(p2.getBestIndex(), -1);  // the edited proposal is not accepted
  EXPECT_EQ(lines(text(p2.getDiff()))[0], "--- vertex 0");
  auto v0 = r.getVertices()[0], v1 = r.getVertices()[1];
  EXPECT_EQ(text(v0.getDecision()), "edited");
  EXPECT_EQ(text(v1.getDecision()), "approved");
  EXPECT_EQ(v1.getState(), schema::VertexState::EVALUATED);
  EXPECT_DOUBLE_EQ(v1.getTimeUs(), modeled_time_us(v1.getCandidate().getSource().cStr()));
  // the node evaluated the edited kernel
  EXPECT_TRUE(node->distinct().count(v1.getCandidate().getSource().cStr()));
  // after approval the next plan moves from the edit, the only accepted vertex
  ASSERT_EQ(r.getVertices().size(), 3u);
  EXPECT_EQ(r.getVertices()[2].getParent(), 1);
  EXPECT_NE(r.getBest(), 0);
}

// edit with a source: the operator's kernel, origin "operator:NAME", parent the proposal.
TEST_F(HitlSupervisor, EditBySourceIsTheOperatorsKernel) {
  script({with_source(DecisionKind::EDIT, operator_kernel), decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  ASSERT_EQ(r.getVertices().size(), 2u);
  auto v0 = r.getVertices()[0], v1 = r.getVertices()[1];
  EXPECT_EQ(text(v0.getDecision()), "edited");
  EXPECT_EQ(v1.getParent(), 0);
  EXPECT_EQ(text(v1.getCandidate().getSource()), operator_kernel);
  EXPECT_EQ(text(v1.getCandidate().getOrigin()), "operator:ana");
  EXPECT_EQ(text(v1.getCandidate().getParentId()), text(v0.getCandidate().getId()));
  EXPECT_EQ(v1.getState(), schema::VertexState::EVALUATED);
  EXPECT_EQ(op->proposal(1).getVertex().getIndex(), 1u);
  EXPECT_TRUE(node->distinct().count(operator_kernel));
}

// take over: the operator's own kernel is a root (no parent), origin "operator:NAME"; the
// proposal is "replaced".
TEST_F(HitlSupervisor, TakeOverIsARootOfTheOperator) {
  script({with_source(DecisionKind::TAKE_OVER, operator_kernel), decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  ASSERT_EQ(r.getVertices().size(), 2u);
  auto v0 = r.getVertices()[0], v1 = r.getVertices()[1];
  EXPECT_EQ(text(v0.getDecision()), "replaced");
  EXPECT_EQ(v1.getParent(), -1);
  EXPECT_EQ(text(v1.getCandidate().getOrigin()), "operator:ana");
  EXPECT_EQ(text(v1.getCandidate().getParentId()), "");
  EXPECT_EQ(text(v1.getCandidate().getSource()), operator_kernel);
  EXPECT_EQ(v1.getState(), schema::VertexState::EVALUATED);
  auto d = lines(text(op->proposal(1).getDiff()));
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0], "--- (nothing)");
  EXPECT_TRUE(node->distinct().count(operator_kernel));
}

// An edit the implementer cannot make: the same vertex is proposed again under a new seq, with
// a notice saying why; nothing is evaluated for it.
TEST_F(HitlSupervisor, AnEditThatCannotBeMadeIsAskedAgain) {
  script({edit({{"block_rows", "\"wide\""}}), approve(), decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  ASSERT_GE(op->proposals.size(), 2u);
  EXPECT_EQ(op->proposal(1).getSeq(), 2u);
  EXPECT_EQ(op->proposal(1).getVertex().getIndex(), 0u);
  EXPECT_EQ(text(op->proposal(1).getVertex().getCandidate().getId()),
            text(op->proposal(0).getVertex().getCandidate().getId()));
  EXPECT_EQ(op->proposal(1).getEvaluations(), 1u);
  bool told = false;
  for (const auto& n : op->notices())
    told = told || (n.find("proposal #1") != std::string::npos &&
                    n.find("asked again") != std::string::npos);
  EXPECT_TRUE(told);
  EXPECT_EQ(text(r.getVertices()[0].getDecision()), "approved");
  // the transcript notes the refusal between the decision and the second proposal
  auto t = transcript(r);
  ASSERT_GE(t.size(), 4u);
  EXPECT_TRUE(t[1].root<schema::TranscriptEntry>().isDecision());
  ASSERT_TRUE(t[2].root<schema::TranscriptEntry>().isNote());
  EXPECT_EQ(t[2].root<schema::TranscriptEntry>().getSeq(), 1u);
  EXPECT_TRUE(t[3].root<schema::TranscriptEntry>().isProposal());
  EXPECT_EQ(t[3].root<schema::TranscriptEntry>().getSeq(), 2u);
}

// hand over 2: the next two proposals come as notices (autoSteps > 0), no decision is asked,
// auto approves them; the one after is asked again.
TEST_F(HitlSupervisor, HandOverLetsAutoDecideTheNextProposals) {
  script({hand_over(2), decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  ASSERT_EQ(r.getVertices().size(), 4u);
  // asked: the first and the fourth
  ASSERT_EQ(op->proposals.size(), 2u);
  EXPECT_EQ(op->proposal(0).getSeq(), 1u);
  EXPECT_EQ(op->proposal(1).getSeq(), 4u);
  EXPECT_EQ(op->proposal(1).getAutoSteps(), 0u);
  // told: the second and third, approved by auto
  EXPECT_EQ(op->noticed_proposals(), (std::vector<unsigned>{2, 3}));
  std::vector<unsigned> auto_steps;
  for (auto& e : op->events)
    if (e.root<schema::OperatorEvent>().isProposal())
      auto_steps.push_back(e.root<schema::OperatorEvent>().getProposal().getAutoSteps());
  for (auto n : auto_steps)
    EXPECT_GT(n, 0u);
  EXPECT_EQ(op->decided_by(), (std::vector<std::string>{"auto", "auto"}));
  for (unsigned k : {0u, 1u, 2u})
    EXPECT_EQ(text(r.getVertices()[k].getDecision()), "approved") << k;
  EXPECT_EQ(text(r.getVertices()[3].getDecision()), "stopped");
  EXPECT_EQ(text(r.getStopReason()), "operator");
  // the transcript holds auto's decisions on 2 and 3, in order
  auto t = transcript(r);
  ASSERT_EQ(t.size(), 9u);
  for (unsigned k = 0; k < 4; ++k) {
    auto de = t[2 * k + 1].root<schema::TranscriptEntry>();
    ASSERT_TRUE(de.isDecision());
    EXPECT_EQ(de.getSeq(), k + 1);
    EXPECT_EQ(text(de.getDecision().getOperator()), k == 1 || k == 2 ? "auto" : "ana");
  }
}

// onTimeout approve: no decision within operatorTimeoutSeconds (the test clock) -> approved by
// the policy; the next proposal is asked.
TEST_F(HitlSupervisor, TimeoutApproves) {
  script({hold(), decision(DecisionKind::STOP)});
  auto s = hitl();
  s.operator_timeout_s = 30;
  s.on_timeout = "approve";
  start(spawn(), s);
  drive();
  ASSERT_EQ(op->proposals.size(), 1u);
  env.advance_time(29s);
  drive();
  EXPECT_EQ(op->proposals.size(), 1u);  // not yet
  EXPECT_FALSE(answer().answered);
  env.advance_time(2s);
  drive();
  ASSERT_EQ(op->proposals.size(), 2u);
  EXPECT_EQ(op->proposal(1).getBestIndex(), 0);
  EXPECT_EQ(op->decided_by(), std::vector<std::string>{"policy"});
  auto o = answer();
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_EQ(text(o.r().getVertices()[0].getDecision()), "approved");
  EXPECT_EQ(text(o.r().getStopReason()), "operator");
  auto t = transcript(o.r());
  ASSERT_GE(t.size(), 2u);
  auto de = t[1].root<schema::TranscriptEntry>();
  ASSERT_TRUE(de.isDecision());
  EXPECT_EQ(de.getDecision().getKind(), DecisionKind::APPROVE);
  EXPECT_EQ(text(de.getDecision().getOperator()), "policy");
}

// onTimeout stop: the search ends when the proposal times out.
TEST_F(HitlSupervisor, TimeoutStops) {
  script({hold()});
  auto s = hitl();
  s.operator_timeout_s = 5;
  s.on_timeout = "stop";
  start(spawn(), s);
  drive();
  ASSERT_EQ(op->proposals.size(), 1u);
  env.advance_time(6s);
  drive();
  auto o = answer();
  ASSERT_TRUE(o.answered);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_EQ(op->proposals.size(), 1u);
  EXPECT_EQ(op->decided_by(), std::vector<std::string>{"policy"});
  EXPECT_EQ(text(o.r().getVertices()[0].getDecision()), "stopped");
  EXPECT_EQ(text(o.r().getStopReason()), "timeout");
  EXPECT_EQ(o.r().getBest(), -1);
}

// onTimeout wait (and no timeout at all): nothing happens however far the clock moves.
TEST_F(HitlSupervisor, TimeoutWaitWaitsForever) {
  for (std::string policy : {"wait", ""}) {
    SCOPED_TRACE(policy);
    op->proposals.clear();
    op->events.clear();
    script({hold()});
    auto s = hitl();
    s.operator_timeout_s = policy.empty() ? 0 : 30;
    s.on_timeout = policy;
    start(spawn(), s);
    drive();
    ASSERT_EQ(op->proposals.size(), 1u);
    unsigned requests = node->requests;
    size_t events = op->events.size();
    for (auto step : {31s, 3600s, 86400s * 30}) {
      env.advance_time(step);
      drive();
    }
    EXPECT_EQ(op->proposals.size(), 1u);
    EXPECT_EQ(op->events.size(), events);
    EXPECT_TRUE(op->decided_by().empty());
    EXPECT_EQ(node->requests, requests);
    EXPECT_FALSE(answer().answered);
  }
}

// Resume: a search stopped while a proposal waits is started again on its graph file; the
// waiting vertex is proposed again (a new seq) and nothing is evaluated again.
TEST_F(HitlSupervisor, AResumedSearchProposesTheWaitingVertexAgain) {
  search::test::temp_dir dir;
  auto s = hitl();
  s.graph_path = dir.file("graph.sqlite");
  script({approve(), hold()});
  auto first = spawn();
  start(first, s);
  drive();
  ASSERT_EQ(op->proposals.size(), 2u);
  auto waiting = op->proposal(1).getVertex();
  unsigned waiting_index = waiting.getIndex();
  std::string waiting_id = waiting.getCandidate().getId().cStr();
  unsigned requests = node->requests;
  ASSERT_GT(requests, 0u);
  env.self->send_exit(first, caf::exit_reason::kill);
  drive();

  script({decision(DecisionKind::STOP, "seen it")});
  s.resume = true;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  ASSERT_EQ(op->proposals.size(), 3u);
  auto again = op->proposal(2);
  EXPECT_EQ(again.getSeq(), 3u);
  EXPECT_EQ(again.getVertex().getIndex(), waiting_index);
  EXPECT_EQ(text(again.getVertex().getCandidate().getId()), waiting_id);
  EXPECT_EQ(node->requests, requests);  // nothing evaluated again
  auto r = o.r();
  EXPECT_TRUE(r.getResumed());
  ASSERT_EQ(r.getVertices().size(), 2u);
  EXPECT_EQ(text(r.getVertices()[0].getDecision()), "approved");
  EXPECT_EQ(text(r.getVertices()[1].getDecision()), "stopped");
  EXPECT_EQ(text(r.getStopReason()), "operator");
  // the transcript goes on from the first search's: p1 d1 p2 (unanswered) p3 d3 end
  auto t = transcript(r);
  ASSERT_EQ(t.size(), 6u);
  unsigned seqs[] = {1, 1, 2, 3, 3, 3};
  for (unsigned i = 0; i < 6; ++i)
    EXPECT_EQ(t[i].root<schema::TranscriptEntry>().getSeq(), seqs[i]) << i;
  EXPECT_TRUE(t[2].root<schema::TranscriptEntry>().isProposal());
  EXPECT_TRUE(t[3].root<schema::TranscriptEntry>().isProposal());
  EXPECT_TRUE(t[4].root<schema::TranscriptEntry>().isDecision());
}

// An evaluation budget ends a hitl search too, once the last proposal within it is decided.
TEST_F(HitlSupervisor, StopsOnTheBudget) {
  script({approve(), approve(), approve()});
  auto s = hitl();
  s.budget = 2;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_EQ(text(o.r().getStopReason()), "budget");
  EXPECT_EQ(o.r().getVertices().size(), 2u);
  EXPECT_EQ(op->proposals.size(), 2u);
  EXPECT_EQ(op->proposal(1).getBudgetEvals(), 2u);
  EXPECT_EQ(op->script.size(), 1u);  // the third decision was never asked for
  EXPECT_EQ(node->requests, evaluations_of(o.r()));
}

// A decision on another proposal than the one asked: the search cannot go on (malformed), and
// the shells are told it ended.
TEST_F(HitlSupervisor, ADecisionForAnotherProposalEndsTheSearch) {
  auto d = approve();
  d.seq_offset = 1;
  script({d});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.answered);
  EXPECT_FALSE(o.result);
  EXPECT_EQ(messages::code_of(o.error), messages::error_code::malformed_message);
  EXPECT_NE(messages::message_of(o.error).find("#2"), std::string::npos)
    << messages::message_of(o.error);
  ASSERT_FALSE(op->events.empty());
  EXPECT_TRUE(op->event(op->events.size() - 1).isEnded());
}

// A node that cannot answer ends a hitl search with its error; the shells are told.
TEST_F(HitlSupervisor, ANodeThatCannotAnswerEndsTheSearch) {
  script({approve(), approve()});
  node->errors[1] = messages::error_code::worker_unavailable;
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.answered);
  EXPECT_FALSE(o.result);
  EXPECT_EQ(messages::code_of(o.error), messages::error_code::worker_unavailable);
  EXPECT_TRUE(op->proposals.empty());
  ASSERT_FALSE(op->events.empty());
  EXPECT_TRUE(op->event(op->events.size() - 1).isEnded());
}

// A kernel that fails (no repairs allowed) is proposed as it is, with its failure; approved,
// it is still no best.
TEST_F(HitlSupervisor, AFailedKernelIsProposedAndNeverTheBest) {
  node->fail_first = true;
  script({approve(), decision(DecisionKind::STOP)});
  auto s = hitl();
  s.max_repairs = 0;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  ASSERT_GE(op->proposals.size(), 1u);
  auto p = op->proposal(0).getVertex();
  EXPECT_EQ(p.getState(), schema::VertexState::FAILED);
  EXPECT_FALSE(p.getCorrect());
  EXPECT_EQ(text(p.getFailureClass()), "vmemOom");
  EXPECT_EQ(text(o.r().getVertices()[0].getDecision()), "approved");
  EXPECT_NE(o.r().getBest(), 0);
  for (auto v : o.r().getVertices())
    EXPECT_NE(v.getParent(), 0);
}

// Resume while the operator's edit is being evaluated: the edit (a pending vertex) is evaluated
// again and proposed; nothing that had finished is evaluated again.
TEST_F(HitlSupervisor, AResumedSearchFinishesAPendingEditThenProposesIt) {
  search::test::temp_dir dir;
  auto s = hitl();
  s.graph_path = dir.file("graph.sqlite");
  script({edit({{"block_rows", "128"}})});
  node->order = answer_order::forward;
  auto first = spawn();
  start(first, s);
  // answer everything until the edited kernel is at the node, then kill the supervisor
  for (;;) {
    env.run_messages();
    ASSERT_FALSE(node->held.empty()) << "the search ended before the edit was evaluated";
    if (!op->proposals.empty())
      break;
    env.self->send(node_actor, release_atom::value);
  }
  ASSERT_EQ(op->proposals.size(), 1u);
  std::string proposed = op->proposal(0).getVertex().getCandidate().getSource().cStr();
  std::string edited = node->sources.back();
  ASSERT_NE(edited, proposed);
  env.self->send_exit(first, caf::exit_reason::kill);
  env.run_messages();
  node->held.clear();
  node->order = answer_order::at_once;
  auto before = node->sources.size();

  script({decision(DecisionKind::STOP)});
  s.resume = true;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  ASSERT_EQ(r.getVertices().size(), 2u);
  EXPECT_EQ(text(r.getVertices()[0].getDecision()), "edited");
  EXPECT_EQ(r.getVertices()[1].getParent(), 0);
  EXPECT_EQ(text(r.getVertices()[1].getCandidate().getSource()), edited);
  // only the edit went to the node again
  for (size_t i = before; i < node->sources.size(); ++i)
    EXPECT_EQ(node->sources[i], edited) << i;
  EXPECT_GT(node->sources.size(), before);
  ASSERT_EQ(op->proposals.size(), 2u);
  EXPECT_EQ(op->proposal(1).getSeq(), 2u);
  EXPECT_EQ(op->proposal(1).getVertex().getIndex(), 1u);
  EXPECT_EQ(text(r.getStopReason()), "operator");
}

// A hand-over outlives a resume: the operator let auto decide 3 proposals; the search is
// killed after auto decided the first of them; resumed, auto decides the other two before
// the operator is asked again.
// A hand-over outlives a resume: the steps auto still has are read from the transcript.
TEST_F(HitlSupervisor, AHandOverOutlivesAResume) {
  search::test::temp_dir dir;
  auto s = hitl();
  s.graph_path = dir.file("graph.sqlite");
  script({hand_over(3)});
  node->order = answer_order::forward;
  auto first = spawn();
  start(first, s);
  for (;;) {
    env.run_messages();
    ASSERT_FALSE(node->held.empty()) << "the search ended early";
    if (op->noticed_proposals().size() == 1)
      break;
    env.self->send(node_actor, release_atom::value);
  }
  env.self->send_exit(first, caf::exit_reason::kill);
  env.run_messages();
  node->held.clear();
  node->order = answer_order::at_once;

  script({decision(DecisionKind::STOP)});
  s.resume = true;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  // seq 1 asked (hand over 3), 2, 3 and 4 decided by auto, 5 asked
  EXPECT_EQ(op->noticed_proposals(), (std::vector<unsigned>{2, 3, 4}));
  ASSERT_EQ(op->proposals.size(), 2u);
  EXPECT_EQ(op->proposal(1).getSeq(), 5u);
  EXPECT_EQ(op->proposal(1).getVertex().getIndex(), 4u);
}

// A kernel the graph holds already cannot be taken over again: the proposal is asked again.
TEST_F(HitlSupervisor, TakingOverWithAKnownKernelIsAskedAgain) {
  script({with_source(DecisionKind::TAKE_OVER, operator_kernel),
          with_source(DecisionKind::TAKE_OVER, operator_kernel), decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  ASSERT_EQ(op->proposals.size(), 3u);
  EXPECT_EQ(op->proposal(1).getVertex().getIndex(), 1u);
  EXPECT_EQ(op->proposal(2).getVertex().getIndex(), 1u);  // the same, again
  EXPECT_EQ(op->proposal(2).getSeq(), 3u);
  bool told = false;
  for (const auto& n : op->notices())
    told = told || n.find("vertex 1 already") != std::string::npos;
  EXPECT_TRUE(told);
  EXPECT_EQ(o.r().getVertices().size(), 2u);
  EXPECT_EQ(text(o.r().getVertices()[1].getDecision()), "stopped");
}

// One search at a time: a second OptimizeRequest while one runs is refused (bad_input); a
// payload that is no OptimizeRequest is malformed. The running search is not disturbed.
TEST_F(HitlSupervisor, RefusesASecondSearchAndMalformedRequests) {
  script({hold()});
  auto sup = spawn();
  start(sup, hitl());
  drive();
  ASSERT_EQ(op->proposals.size(), 1u);
  env.self->send(sup, messages::optimize_atom::value, optimize_request(hitl()));
  drive();
  auto second = answer();
  ASSERT_TRUE(second.answered);
  EXPECT_EQ(messages::code_of(second.error), messages::error_code::bad_input);
  EXPECT_EQ(op->proposals.size(), 1u);
  // an idle supervisor: the payload is checked
  auto idle = spawn();
  env.self->send(idle, messages::optimize_atom::value,
                 messages::payload{capnp::typeId<schema::Proposal>(), "x"});
  drive();
  auto bad = answer();
  ASSERT_TRUE(bad.answered);
  EXPECT_EQ(messages::code_of(bad.error), messages::error_code::malformed_message);
  env.self->send(idle, messages::optimize_atom::value,
                 messages::payload{capnp::typeId<schema::OptimizeRequest>(), "not capnp"});
  drive();
  auto junk = answer();
  ASSERT_TRUE(junk.answered);
  EXPECT_EQ(messages::code_of(junk.error), messages::error_code::bad_input);
  EXPECT_EQ(op->proposals.size(), 1u);
  to_stop.push_back(caf::actor_cast<caf::actor>(idle));
}

// The tester's cases only for a proposal faster than the best accepted when its step started
// (a rejected kernel sets no bar, however fast); the operator reads why in the proposal's
// verdict.
TEST_F(HitlSupervisor, OnlyAProposalFasterThanTheBestAcceptedGetsTheTestersCases) {
  script({approve(), decision(DecisionKind::REJECT, "not this one"), approve(), approve(),
          approve(), approve(), approve(), decision(DecisionKind::STOP)});
  auto o = optimize(spawn(), hitl());
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  std::vector<double> bars;
  for (unsigned k = 0; k < r.getVertices().size(); ++k)
    bars.push_back(best_time_before(r, k));
  EXPECT_GT(expect_cases_only_when_faster(r, bars, *node), 0u);
  ASSERT_EQ(op->proposals.size(), r.getVertices().size());
  for (unsigned k = 0; k < r.getVertices().size(); ++k) {
    auto p = op->proposal(k).getVertex();
    EXPECT_EQ(p.getCasesSkipped(), r.getVertices()[k].getCasesSkipped()) << k;
    EXPECT_EQ(text(p.getVerdict()), text(r.getVertices()[k].getVerdict())) << k;
  }
  EXPECT_EQ(node->requests, evaluations_of(r));
}
