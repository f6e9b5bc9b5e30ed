// The auto supervisor through its actors under CAF's deterministic scheduler: the real pool
// (expert brains, tester, profiler) over the recorded rmsnorm_3d analysis, a stand-in TPU node
// (supervisor_fixture.hpp). The chain plan -> implement -> evaluate -> profile -> plan from the
// best, the evaluation budget, the best correct kept, the debugger on a failing kernel, and the
// same search whatever order the node answers in.
#include "actors/auto_supervisor.hpp"
#include "messages/error.hpp"
#include "search/temp_dir.hpp"
#include "tests/actors/supervisor_fixture.hpp"

#include <caf/exit_reason.hpp>
#include <gtest/gtest.h>

using namespace maxkernel;
using namespace maxkernel::actors_test;

namespace {

class AutoSupervisor : public supervisor_fixture {
protected:
  messages::supervisor_actor spawn() {
    return actors::spawn_auto_supervisor(env.sys, pool, caf::actor_cast<messages::tpu_node_actor>(node_actor),
                                         messages::progress_listener_actor{});
  }
};

// The fastest correct vertex among the first `k`; -1 when none.
int best_before(schema::OptimizeResult::Reader r, unsigned k) {
  int best = -1;
  for (unsigned i = 0; i < k; ++i) {
    auto v = r.getVertices()[i];
    if (v.getState() == schema::VertexState::EVALUATED && v.getCorrect() &&
        (best < 0 || v.getTimeUs() < r.getVertices()[static_cast<unsigned>(best)].getTimeUs()))
      best = static_cast<int>(i);
  }
  return best;
}

unsigned evaluations_of(schema::OptimizeResult::Reader r) {
  unsigned n = 0;
  for (auto v : r.getVertices())
    n += v.getEvaluations();
  return n;
}

}  // namespace

TEST_F(AutoSupervisor, ChainPlansFromTheBestUntilTheBudget) {
  auto o = optimize(spawn(), {.mode = "auto", .budget = 4});
  ASSERT_TRUE(o.answered);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  EXPECT_EQ(std::string(r.getStopReason().cStr()), "budget");
  EXPECT_EQ(r.getCandidatesEvaluated(), 4u);
  ASSERT_EQ(r.getVertices().size(), 4u);
  EXPECT_EQ(r.getRounds(), 4u);
  // One kernel per iteration: a template first, then each a move from the best so far.
  auto v0 = r.getVertices()[0];
  EXPECT_EQ(v0.getParent(), -1);
  EXPECT_EQ(std::string(v0.getStrategy().cStr()).rfind("template ", 0), 0u) << v0.getStrategy().cStr();
  std::set<std::string> ids;
  for (unsigned k = 0; k < 4; ++k) {
    auto v = r.getVertices()[k];
    SCOPED_TRACE(k);
    EXPECT_EQ(v.getIndex(), k);
    EXPECT_EQ(v.getRound(), k);
    EXPECT_EQ(v.getState(), schema::VertexState::EVALUATED);
    EXPECT_TRUE(v.getCorrect()) << v.getVerdict().cStr();
    // evaluated by the node, its time from the node's profile, diagnosed by the profiler
    EXPECT_DOUBLE_EQ(v.getTimeUs(), modeled_time_us(v.getCandidate().getSource().cStr()));
    EXPECT_TRUE(v.getHasDiagnosis());
    // the node's evaluation, plus the tester's cases when it could become the best
    if (!v.getCasesSkipped()) {
      EXPECT_GT(v.getEvaluations(), 1u);
    }
    ids.insert(v.getCandidate().getId().cStr());
    if (k > 0) {
      EXPECT_EQ(v.getParent(), best_before(r, k));
      auto parent = r.getVertices()[static_cast<unsigned>(v.getParent())];
      EXPECT_EQ(std::string(v.getCandidate().getParentId().cStr()),
                std::string(parent.getCandidate().getId().cStr()));
      EXPECT_NE(std::string(v.getStrategy().cStr()).rfind("template", 0), 0u);
    }
  }
  EXPECT_EQ(ids.size(), 4u);  // never the same kernel twice
  // The node was asked exactly what the vertices say they took, about those kernels only.
  EXPECT_EQ(node->requests, evaluations_of(r));
  EXPECT_EQ(r.getEvaluations(), node->requests);
  EXPECT_EQ(node->distinct().size(), 4u);
  // The best is the fastest correct one; the curve follows the best after each candidate.
  EXPECT_EQ(r.getBest(), best_before(r, 4));
  ASSERT_EQ(r.getBestPerEvaluation().size(), 4u);
  for (unsigned k = 0; k < 4; ++k)
    EXPECT_DOUBLE_EQ(r.getBestPerEvaluation()[k],
                     r.getVertices()[static_cast<unsigned>(best_before(r, k + 1))].getTimeUs());
  // The moves found something faster than the first kernel (the modeled times differ).
  EXPECT_LT(r.getVertices()[static_cast<unsigned>(r.getBest())].getTimeUs(), v0.getTimeUs());
}

TEST_F(AutoSupervisor, StopsOnTheBudget) {
  for (unsigned budget : {1u, 3u}) {
    SCOPED_TRACE(budget);
    node->requests = 0;
    auto o = optimize(spawn(), {.mode = "auto", .budget = budget});
    ASSERT_TRUE(o.result) << messages::message_of(o.error);
    EXPECT_EQ(std::string(o.r().getStopReason().cStr()), "budget");
    EXPECT_EQ(o.r().getCandidatesEvaluated(), budget);
    EXPECT_EQ(o.r().getVertices().size(), budget);
    EXPECT_EQ(node->requests, evaluations_of(o.r()));
  }
}

// A failing kernel is not the best, however fast it would have been: the fastest kernel of a
// first search fails at lowering in a second one (no repairs); the best is then the fastest
// of those that are correct.
TEST_F(AutoSupervisor, KeepsTheBestCorrect) {
  auto first = optimize(spawn(), {.mode = "auto", .budget = 4});
  ASSERT_TRUE(first.result) << messages::message_of(first.error);
  auto fastest = first.r().getVertices()[static_cast<unsigned>(first.r().getBest())];
  std::string fastest_source = fastest.getCandidate().getSource().cStr();
  ASSERT_GT(first.r().getBest(), 0);  // a move, not the first kernel

  node->failing.insert(fastest_source);
  auto o = optimize(spawn(), {.mode = "auto", .budget = 4, .max_repairs = 0});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  int failed = -1;
  for (unsigned i = 0; i < r.getVertices().size(); ++i)
    if (r.getVertices()[i].getCandidate().getSource() == fastest_source.c_str())
      failed = static_cast<int>(i);
  ASSERT_GE(failed, 0) << "the same chain reaches the same kernel";
  auto f = r.getVertices()[static_cast<unsigned>(failed)];
  EXPECT_EQ(f.getState(), schema::VertexState::FAILED);
  EXPECT_FALSE(f.getCorrect());
  EXPECT_EQ(std::string(f.getFailureClass().cStr()), "vmemOom");
  EXPECT_EQ(f.getRepairs(), 0u);
  ASSERT_GE(r.getBest(), 0);
  EXPECT_NE(r.getBest(), failed);
  EXPECT_EQ(r.getBest(), best_before(r, r.getVertices().size()));
  // A failed kernel is no parent either.
  for (auto v : r.getVertices())
    EXPECT_NE(v.getParent(), failed);
  ASSERT_EQ(r.getFailures().size(), 1u);
  EXPECT_EQ(std::string(r.getFailures()[0].getFailureClass().cStr()), "vmemOom");
}

TEST_F(AutoSupervisor, AFailingKernelGoesToTheDebugger) {
  node->fail_first = true;
  auto o = optimize(spawn(), {.mode = "auto", .budget = 2, .max_repairs = 2});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  ASSERT_EQ(node->failing.size(), 1u);
  std::string broken = *node->failing.begin();
  auto v0 = o.r().getVertices()[0];
  // The debugger's repair was evaluated in the same lineage and is the vertex's kernel.
  EXPECT_EQ(v0.getState(), schema::VertexState::EVALUATED);
  EXPECT_TRUE(v0.getCorrect()) << v0.getVerdict().cStr();
  EXPECT_EQ(v0.getRepairs(), 1u);
  ASSERT_EQ(v0.getAttemptFailures().size(), 1u);
  EXPECT_EQ(std::string(v0.getAttemptFailures()[0].cStr()), "vmemOom");
  EXPECT_NE(std::string(v0.getCandidate().getSource().cStr()), broken);
  EXPECT_EQ(std::string(v0.getCandidate().getStrategy().cStr()).rfind("repair: ", 0), 0u)
    << v0.getCandidate().getStrategy().cStr();
  EXPECT_EQ(std::string(v0.getStrategy().cStr()).rfind("template ", 0), 0u) << v0.getStrategy().cStr();
  EXPECT_EQ(node->sources.front(), broken);
  EXPECT_EQ(node->sources[1], std::string(v0.getCandidate().getSource().cStr()));
  ASSERT_EQ(o.r().getFailures().size(), 1u);
  EXPECT_EQ(o.r().getFailures()[0].getCount(), 1u);
  // The next iteration moves from the repaired kernel.
  EXPECT_EQ(o.r().getVertices()[1].getParent(), 0);
}

TEST_F(AutoSupervisor, TheSameSearchWhateverOrderTheNodeAnswersIn) {
  auto at_once = optimize(spawn(), {.mode = "auto", .budget = 4});
  ASSERT_TRUE(at_once.result) << messages::message_of(at_once.error);
  node->order = answer_order::reversed;
  node->fail_first = false;
  auto reversed = optimize(spawn(), {.mode = "auto", .budget = 4});
  ASSERT_TRUE(reversed.result) << messages::message_of(reversed.error);
  EXPECT_GT(node->max_held, 1u);  // the tester's cases were answered last first
  EXPECT_EQ(vertex_bytes(at_once.r()), vertex_bytes(reversed.r()));
  EXPECT_EQ(at_once.r().getBest(), reversed.r().getBest());
  EXPECT_EQ(std::string(reversed.r().getStopReason().cStr()), "budget");
}

// Every vertex keeps the planner's expected effect of its step (PlanStep.expectedEffect).
TEST_F(AutoSupervisor, VerticesKeepThePlannersExpectedEffect) {
  auto o = optimize(spawn(), {.mode = "auto", .budget = 2});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  for (auto v : o.r().getVertices())
    EXPECT_FALSE(v.getExpectedEffect().size() == 0) << v.getIndex();
}

// A deadline that passed (worker_timeout) is the candidate's failure (class timeout), not the
// search's: the lineage goes to the debugger and the search goes on.
TEST_F(AutoSupervisor, ADeadlinePassedIsTheCandidatesFailure) {
  node->errors[1] = messages::error_code::worker_timeout;
  auto o = optimize(spawn(), {.mode = "auto", .budget = 2, .max_repairs = 1});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto v0 = o.r().getVertices()[0];
  ASSERT_GE(v0.getAttemptFailures().size(), 1u);
  EXPECT_EQ(std::string(v0.getAttemptFailures()[0].cStr()), "timeout");
  EXPECT_EQ(o.r().getCandidatesEvaluated(), 2u);
  EXPECT_EQ(std::string(o.r().getStopReason().cStr()), "budget");
}

// Any other node error stops the search with that error (the infrastructure cannot go on).
TEST_F(AutoSupervisor, ANodeThatCannotAnswerStopsTheSearch) {
  node->errors[2] = messages::error_code::worker_unavailable;
  auto sup = spawn();
  auto o = optimize(sup, {.mode = "auto", .budget = 3});
  ASSERT_TRUE(o.answered);
  EXPECT_FALSE(o.result);
  EXPECT_EQ(messages::code_of(o.error), messages::error_code::worker_unavailable);
  // the supervisor is idle again: a new search is accepted
  node->errors.clear();
  auto again = optimize(sup, {.mode = "auto", .budget = 1});
  ASSERT_TRUE(again.result) << messages::message_of(again.error);
}

// A search killed while a candidate is at the node resumes with that candidate only, and ends
// with the vertices an uninterrupted search makes.
TEST_F(AutoSupervisor, AResumedSearchEvaluatesOnlyThePendingCandidate) {
  search_settings plain{.mode = "auto", .budget = 4};
  auto whole = optimize(spawn(), plain);
  ASSERT_TRUE(whole.result) << messages::message_of(whole.error);

  search::test::temp_dir dir;
  search_settings s = plain;
  s.graph_path = dir.file("graph.sqlite");
  node->sources.clear();
  node->order = answer_order::forward;
  auto first = spawn();
  start(first, s);
  // answer until the third kernel is at the node
  for (;;) {
    env.run_messages();
    ASSERT_FALSE(node->held.empty()) << "the search ended early";
    if (node->distinct().size() == 3)
      break;
    env.self->send(node_actor, release_atom::value);
  }
  std::string pending = node->sources.back();
  env.self->send_exit(first, caf::exit_reason::kill);
  env.run_messages();
  node->held.clear();
  node->order = answer_order::at_once;
  std::set<std::string> earlier = node->distinct();
  size_t before = node->sources.size();

  s.resume = true;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_TRUE(o.r().getResumed());
  for (size_t i = before; i < node->sources.size(); ++i)
    if (earlier.count(node->sources[i])) {
      EXPECT_TRUE(node->sources[i] == pending) << "a finished candidate evaluated again";
    }
  EXPECT_EQ(vertex_bytes(o.r()), vertex_bytes(whole.r()));
  EXPECT_EQ(std::string(o.r().getStopReason().cStr()), "budget");
}

// The bars of an auto search: each iteration's, the best before its vertex.
std::vector<double> auto_bars(schema::OptimizeResult::Reader r) {
  std::vector<double> bars;
  for (unsigned k = 0; k < r.getVertices().size(); ++k)
    bars.push_back(best_time_before(r, k));
  return bars;
}

// The tester's cases only for a candidate faster than the best when its iteration started:
// the first runs them (no best yet), a slower one is correct on the node's test alone and
// its verdict says why; the best is never such a one.
TEST_F(AutoSupervisor, OnlyAFasterCandidateGetsTheTestersCases) {
  // v5p, a megacore device: the planner also offers dimension semantics, which the stand-in
  // node times like the parent (it reads only numeric params), so one move ties the best.
  auto o = optimize(spawn(), {.mode = "auto", .budget = 8, .chip = "v5p"});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  unsigned n = r.getVertices().size();
  ASSERT_GE(n, 4u);
  EXPECT_FALSE(r.getVertices()[0].getCasesSkipped());
  auto bars = auto_bars(r);
  unsigned skipped = expect_cases_only_when_faster(r, bars, *node);
  EXPECT_GT(skipped, 0u) << "no move was slower than the best: nothing shows the skip";
  // A move as fast as the best (a tie) skips the cases too, and the earlier stays the best.
  bool tie = false;
  for (unsigned k = 1; k < n; ++k)
    tie = tie || r.getVertices()[k].getTimeUs() == bars[k];
  EXPECT_TRUE(tie) << "no move ties the best: the tie is not exercised";
  EXPECT_LT(skipped, n - 1) << "no move was faster than the best: nothing shows the cases";
  EXPECT_EQ(node->requests, evaluations_of(r));
  EXPECT_EQ(r.getBest(), best_before(r, n));
}

// --test-every-candidate: every candidate gets the cases; where they all pass the search
// takes the same steps (which candidates get cases changes no choice).
TEST_F(AutoSupervisor, TestEveryCandidateRunsTheCasesForEach) {
  auto lazy = optimize(spawn(), {.mode = "auto", .budget = 6});
  ASSERT_TRUE(lazy.result) << messages::message_of(lazy.error);
  unsigned lazy_requests = node->requests;
  node->requests = 0;
  node->case_sources.clear();
  auto every = optimize(spawn(), {.mode = "auto", .budget = 6, .test_every_candidate = true});
  ASSERT_TRUE(every.result) << messages::message_of(every.error);
  auto r = every.r();
  expect_cases_only_when_faster(r, std::vector<double>(r.getVertices().size(), 0.0), *node);
  ASSERT_EQ(r.getVertices().size(), lazy.r().getVertices().size());
  for (unsigned k = 0; k < r.getVertices().size(); ++k) {
    EXPECT_FALSE(r.getVertices()[k].getCasesSkipped());
    EXPECT_EQ(std::string(r.getVertices()[k].getCandidate().getSource().cStr()),
              std::string(lazy.r().getVertices()[k].getCandidate().getSource().cStr()))
      << k;
  }
  EXPECT_EQ(r.getBest(), lazy.r().getBest());
  EXPECT_GT(node->requests, lazy_requests);
}

// A candidate faster than the best whose tester's cases fail is not correct and goes to the
// debugger, as before; so does the first candidate (no best yet: every case). A slower one
// failing the same cases is accepted on the node's test alone (the price of the skip, paid
// only by a kernel that cannot become the result): the search is the one it was.
TEST_F(AutoSupervisor, FailingCasesOfAFasterCandidateGoToTheDebugger) {
  search_settings s{.mode = "auto", .budget = 8, .max_repairs = 1};
  auto first = optimize(spawn(), s);
  ASSERT_TRUE(first.result) << messages::message_of(first.error);
  int faster = -1, slower = -1;
  for (unsigned k = 1; k < first.r().getVertices().size(); ++k) {
    auto v = first.r().getVertices()[k];
    if (!v.getCasesSkipped() && faster < 0)
      faster = static_cast<int>(k);
    if (v.getCasesSkipped() && slower < 0)
      slower = static_cast<int>(k);
  }
  ASSERT_GT(faster, 0);
  ASSERT_GT(slower, 0);
  auto source = [&](int k) {
    return std::string(
      first.r().getVertices()[static_cast<unsigned>(k)].getCandidate().getSource().cStr());
  };
  for (int k : {0, faster}) {
    SCOPED_TRACE(k);
    node->failing_cases = {source(k)};
    auto o = optimize(spawn(), s);
    ASSERT_TRUE(o.result) << messages::message_of(o.error);
    auto v = o.r().getVertices()[static_cast<unsigned>(k)];
    ASSERT_GE(v.getAttemptFailures().size(), 1u);
    EXPECT_EQ(std::string(v.getAttemptFailures()[0].cStr()), "mismatch");
    // the debugger was asked: it repaired the kernel, or gave up
    std::string verdict = v.getVerdict().cStr();
    EXPECT_TRUE(v.getRepairs() == 1u || verdict.find("debugger") != std::string::npos)
      << verdict;
    EXPECT_FALSE(v.getCasesSkipped());
    EXPECT_NE(o.r().getBest(), k) << "a kernel that failed its cases is the best";
  }
  node->failing_cases = {source(slower)};
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_TRUE(o.r().getVertices()[static_cast<unsigned>(slower)].getCasesSkipped());
  EXPECT_EQ(vertex_bytes(o.r()), vertex_bytes(first.r()));
}
