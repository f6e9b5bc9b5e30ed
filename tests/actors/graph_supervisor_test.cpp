// The graph supervisor through its actors under CAF's deterministic scheduler (the real pool,
// a stand-in node: supervisor_fixture.hpp): a round's children are fixed (recorded pending in
// the graph file) before any is dispatched, the outcome is the same whatever order the node
// answers in, and the evaluation budget holds even when it cuts a round.
#include "actors/graph_supervisor.hpp"
#include "actors/search_record.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "search/temp_dir.hpp"
#include "tests/actors/supervisor_fixture.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

using namespace maxkernel;
using namespace maxkernel::actors_test;

namespace {

class GraphSupervisor : public supervisor_fixture {
protected:
  messages::supervisor_actor spawn() {
    return actors::spawn_graph_supervisor(env.sys, pool,
                                          caf::actor_cast<messages::tpu_node_actor>(node_actor),
                                          messages::progress_listener_actor{});
  }
};

unsigned evaluations_of(schema::OptimizeResult::Reader r) {
  unsigned n = 0;
  for (auto v : r.getVertices())
    n += v.getEvaluations();
  return n;
}

}  // namespace

// Every time the node holds answers, it was asked about children of one round only, and about
// every child of that round: none was chosen after another's result was in. The graph file,
// written behind the search, holds the whole search once the result is delivered.
TEST_F(GraphSupervisor, ARoundsChildrenAreFixedBeforeDispatch) {
  search::test::temp_dir dir;
  search_settings s{.mode = "graph", .budget = 7, .graph_path = dir.file("graph.sqlite")};
  auto request = optimize_request(s);
  std::string error;
  auto req = messages::open_payload<schema::OptimizeRequest>(request, error);
  ASSERT_TRUE(req) << error;
  node->order = answer_order::forward;
  start(spawn(), s);
  struct snapshot {
    std::set<std::string> held, ever;  // sources the node holds answers for; ever asked
  };
  std::vector<snapshot> snapshots;
  for (;;) {
    env.run_messages();
    if (node->held.empty())
      break;
    snapshot snap;
    snap.held = node->held_sources();
    snap.ever = node->distinct();
    snapshots.push_back(std::move(snap));
    env.self->send(node_actor, release_atom::value);
  }
  auto o = answer();
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  EXPECT_GE(snapshots.size(), 2u);
  std::map<unsigned, std::set<std::string>> by_round;
  for (auto v : r.getVertices())
    by_round[v.getRound()].insert(v.getCandidate().getSource().cStr());
  EXPECT_GE(by_round.size(), 2u);
  for (size_t k = 0; k < snapshots.size(); ++k) {
    // The round whose children the held requests are about (a tester's case of a child is a
    // request about the child's kernel too).
    auto in = [&](const std::set<std::string>& children) {
      return std::includes(children.begin(), children.end(), snapshots[k].held.begin(),
                           snapshots[k].held.end());
    };
    auto round = std::find_if(by_round.begin(), by_round.end(),
                              [&](const auto& e) { return in(e.second); });
    ASSERT_NE(round, by_round.end()) << "snapshot " << k << ": held requests of two rounds, or "
                                     << "about a kernel that is no child";
    for (auto& child : round->second)
      EXPECT_TRUE(snapshots[k].ever.count(child))
        << "snapshot " << k << ": a child of round " << round->first << " not asked yet";
  }
  // The graph file holds what the result holds.
  actors::search_record file;
  auto rq = req->root<schema::OptimizeRequest>();
  ASSERT_TRUE(file.open(s.graph_path, rq.getSpec(), rq.getSettings(), true, error)) << error;
  ASSERT_EQ(file.size(), r.getVertices().size());
  for (size_t i = 0; i < file.size(); ++i) {
    EXPECT_EQ(file.vertex(i).getState(), r.getVertices()[static_cast<unsigned>(i)].getState());
    EXPECT_EQ(file.vertex(i).getCandidate().getId(),
              r.getVertices()[static_cast<unsigned>(i)].getCandidate().getId());
  }
  // A later round's children are moves from vertices of earlier rounds.
  for (auto v : r.getVertices())
    if (v.getParent() >= 0) {
      EXPECT_LT(r.getVertices()[static_cast<unsigned>(v.getParent())].getRound(), v.getRound());
    }
}

TEST_F(GraphSupervisor, TheOutcomeDoesNotDependOnTheNodesAnswerOrder) {
  search_settings s{.mode = "graph", .budget = 7};
  node->order = answer_order::forward;
  auto forward = optimize(spawn(), s);
  ASSERT_TRUE(forward.result) << messages::message_of(forward.error);
  auto forward_sources = node->sources;
  node->order = answer_order::reversed;
  node->sources.clear();
  node->max_held = 0;
  auto reversed = optimize(spawn(), s);
  ASSERT_TRUE(reversed.result) << messages::message_of(reversed.error);
  // The answers did arrive in another order (several at once, last first)...
  EXPECT_GT(node->max_held, 2u);
  // ...and the graph is the same: vertices (parents, kernels, results, diagnoses), best.
  EXPECT_EQ(reversed.r().getVertices().size(), 7u);
  EXPECT_EQ(vertex_bytes(forward.r()), vertex_bytes(reversed.r()));
  EXPECT_EQ(forward.r().getBest(), reversed.r().getBest());
  EXPECT_EQ(forward.r().getRounds(), reversed.r().getRounds());
  EXPECT_GE(forward.r().getRounds(), 2u);
  // the same kernels were asked about, each as often
  auto a = forward_sources, b = node->sources;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

TEST_F(GraphSupervisor, RespectsTheBudgetEvenInTheMiddleOfARound) {
  // With beam 2 x branching 2 a later round has up to 4 children; budgets that end inside
  // one cut it, and each round takes at most half of what is left.
  for (unsigned budget : {2u, 5u, 6u}) {
    SCOPED_TRACE(budget);
    node->requests = 0;
    auto o = optimize(spawn(), {.mode = "graph", .budget = budget});
    ASSERT_TRUE(o.result) << messages::message_of(o.error);
    auto r = o.r();
    EXPECT_EQ(std::string(r.getStopReason().cStr()), "budget");
    EXPECT_EQ(r.getCandidatesEvaluated(), budget);
    EXPECT_EQ(r.getVertices().size(), budget);
    EXPECT_EQ(node->requests, evaluations_of(r));
    for (auto v : r.getVertices())
      EXPECT_NE(v.getState(), schema::VertexState::PENDING);
    // No round takes more than half of what the budget left it (rounded up).
    std::map<unsigned, unsigned> width;
    for (auto v : r.getVertices())
      ++width[v.getRound()];
    unsigned left = budget;
    for (auto [round, n] : width) {
      EXPECT_LE(n, left - left / 2) << "round " << round;
      left -= n;
    }
    EXPECT_GE(width.size(), budget == 2 ? 2u : 3u);
  }
}

// Every vertex keeps the planner's expected effect of its step (PlanStep.expectedEffect).
TEST_F(GraphSupervisor, VerticesKeepThePlannersExpectedEffect) {
  auto o = optimize(spawn(), {.mode = "graph", .budget = 3});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  for (auto v : o.r().getVertices())
    EXPECT_FALSE(v.getExpectedEffect().size() == 0) << v.getIndex();
}

// The same with a kernel that fails and is repaired by the debugger inside a round.
TEST_F(GraphSupervisor, TheOutcomeDoesNotDependOnAnswerOrderWithARepair) {
  search_settings s{.mode = "graph", .budget = 6, .max_repairs = 2};
  node->fail_first = true;
  node->order = answer_order::forward;
  auto forward = optimize(spawn(), s);
  ASSERT_TRUE(forward.result) << messages::message_of(forward.error);
  node->order = answer_order::reversed;
  node->sources.clear();  // the same kernel fails again (it stays in `failing`)
  auto reversed = optimize(spawn(), s);
  ASSERT_TRUE(reversed.result) << messages::message_of(reversed.error);
  unsigned repaired = 0;
  for (auto v : forward.r().getVertices())
    repaired += v.getRepairs();
  EXPECT_EQ(repaired, 1u);
  EXPECT_EQ(vertex_bytes(forward.r()), vertex_bytes(reversed.r()));
  EXPECT_EQ(forward.r().getBest(), reversed.r().getBest());
}

// A search killed in the middle of a round resumes with that round's children (fixed before
// dispatch): only they go to the node again, and the graph is the one an uninterrupted search
// makes.
TEST_F(GraphSupervisor, AResumedSearchFinishesTheRoundItWasKilledIn) {
  search_settings plain{.mode = "graph", .budget = 7};
  auto whole = optimize(spawn(), plain);
  ASSERT_TRUE(whole.result) << messages::message_of(whole.error);

  search::test::temp_dir dir;
  search_settings s = plain;
  s.graph_path = dir.file("graph.sqlite");
  auto request = optimize_request(s);
  std::string error;
  auto req = messages::open_payload<schema::OptimizeRequest>(request, error);
  ASSERT_TRUE(req) << error;
  node->sources.clear();
  node->order = answer_order::forward;
  auto first = spawn();
  start(first, s);
  // Answers are released until the node holds a child of a later round than the first.
  std::set<std::string> first_round;
  for (auto v : whole.r().getVertices())
    if (v.getRound() == 0)
      first_round.insert(v.getCandidate().getSource().cStr());
  std::set<std::string> held;
  for (;;) {
    env.run_messages();
    ASSERT_FALSE(node->held.empty()) << "the search ended before its second round";
    held = node->held_sources();
    if (!first_round.count(*held.begin()))
      break;
    env.self->send(node_actor, release_atom::value);
  }
  env.self->send_exit(first, caf::exit_reason::kill);
  env.run_messages();
  // The killed search's file: the round that was out is pending there.
  std::set<std::string> in_flight;
  {
    actors::search_record file;
    auto r = req->root<schema::OptimizeRequest>();
    ASSERT_TRUE(file.open(s.graph_path, r.getSpec(), r.getSettings(), true, error)) << error;
    for (size_t i = 0; i < file.size(); ++i)
      if (file.vertex(i).getState() == schema::VertexState::PENDING)
        in_flight.insert(file.vertex(i).getCandidate().getSource().cStr());
  }
  ASSERT_FALSE(in_flight.empty());
  EXPECT_TRUE(std::includes(in_flight.begin(), in_flight.end(), held.begin(), held.end()));
  node->held.clear();
  node->order = answer_order::at_once;
  size_t before = node->sources.size();
  std::set<std::string> earlier(node->sources.begin(), node->sources.end());

  s.resume = true;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  EXPECT_TRUE(o.r().getResumed());
  // the round that was out goes again; nothing evaluated before it does
  std::set<std::string> again;
  for (size_t i = before; i < node->sources.size(); ++i)
    if (earlier.count(node->sources[i]))
      again.insert(node->sources[i]);
  EXPECT_EQ(again.size(), in_flight.size());
  EXPECT_TRUE(again == in_flight);
  EXPECT_EQ(vertex_bytes(o.r()), vertex_bytes(whole.r()));
  EXPECT_EQ(o.r().getBest(), whole.r().getBest());
}

// The tester's cases in a round go only to children faster than the best when the round
// started (the bar is fixed before dispatch): the first round (no best) runs them all, and
// the skipped children are the same whatever order the node answers in.
TEST_F(GraphSupervisor, OnlyChildrenFasterThanTheRoundsStartGetTheTestersCases) {
  for (auto order : {answer_order::forward, answer_order::reversed}) {
    SCOPED_TRACE(order == answer_order::forward ? "forward" : "reversed");
    node->order = order;
    node->case_sources.clear();
    node->requests = 0;
    auto o = optimize(spawn(), {.mode = "graph", .budget = 10});
    ASSERT_TRUE(o.result) << messages::message_of(o.error);
    auto r = o.r();
    // A vertex's bar: the best among the vertices of earlier rounds (indices before its
    // round's first).
    std::map<unsigned, unsigned> first_of_round;
    for (auto v : r.getVertices())
      first_of_round.emplace(v.getRound(), v.getIndex());
    std::vector<double> bars;
    for (auto v : r.getVertices())
      bars.push_back(best_time_before(r, first_of_round[v.getRound()]));
    for (auto v : r.getVertices())
      if (v.getRound() == r.getVertices()[0].getRound()) {
        EXPECT_FALSE(v.getCasesSkipped()) << v.getIndex();
      }
    EXPECT_GT(expect_cases_only_when_faster(r, bars, *node), 0u);
    EXPECT_EQ(node->requests, evaluations_of(r));
  }
}

// --test-every-candidate: every child of every round gets the cases.
TEST_F(GraphSupervisor, TestEveryCandidateRunsTheCasesForEachChild) {
  auto o = optimize(spawn(), {.mode = "graph", .budget = 10, .test_every_candidate = true});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  EXPECT_EQ(expect_cases_only_when_faster(r, std::vector<double>(r.getVertices().size(), 0.0),
                                          *node),
            0u);
}

// The search's store scope is on every evaluation request, the tester's cases included
// (their options are the plan's, the scope is the search's).
TEST_F(GraphSupervisor, EveryRequestCarriesTheSearchsStoreScope) {
  auto o = optimize(spawn(), {.mode = "graph",
                              .budget = 6,
                              .test_every_candidate = true,
                              .store_scope = "bench-graph"});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  ASSERT_FALSE(node->case_sources.empty());
  EXPECT_EQ(node->scopes.size(), node->requests);
  EXPECT_EQ(node->scopes.count("bench-graph"), node->requests);
}

// A child that failed and was repaired into another kernel is not proposed again: when its
// parent is expanded in a later round, a planner's step that yields the failed kernel is the
// same kernel as that vertex (Vertex.triedIds), not a new child. Seen on a real search: the
// same failing growBlock child re-evaluated (from the store) in every round, spending budget.
TEST_F(GraphSupervisor, AKernelARepairReplacedIsNotProposedAgain) {
  // Breadth every round: round 1 has both of vertex 0's children.
  search_settings s{.mode = "graph", .budget = 8, .beam = 1, .branching = 2, .max_repairs = 2,
                    .dive = false};
  auto plain = optimize(spawn(), s);
  ASSERT_TRUE(plain.result) << messages::message_of(plain.error);
  // Round 1's children fail from now on, with a runtime error: the expert debugger's repair
  // goes back to the template's first parameters (the parent's kernel), so the planner's
  // history does not show the moves it tried, the parent stays the best and is expanded
  // again.
  std::vector<std::string> children;
  for (auto v : plain.r().getVertices())
    if (v.getRound() == 1)
      children.push_back(v.getCandidate().getSource().cStr());
  ASSERT_EQ(children.size(), 2u);
  *node = node_book{};
  node->failing.insert(children.begin(), children.end());
  node->failing_class = schema::ErrorClass::RUNTIME_ERROR;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  for (const auto& child : children)
    EXPECT_EQ(std::count(node->sources.begin(), node->sources.end(), child), 1);
  unsigned with_tried = 0;
  for (auto v : o.r().getVertices()) {
    if (v.getTriedIds().size() == 0)
      continue;
    ++with_tried;
    EXPECT_EQ(v.getTriedIds().size(), v.getRepairs()) << v.getIndex();
    EXPECT_NE(std::string(v.getTriedIds()[0].cStr()), std::string(v.getCandidate().getId().cStr()));
  }
  EXPECT_EQ(with_tried, 2u);
}

namespace {

// A vertex's change from its parent, as the test reads it from their params: each changed
// number "name+" / "name-", any other value "name=value" (the VMEM limit follows the blocks).
std::string change_of(schema::OptimizeResult::Reader r, schema::Vertex::Reader v) {
  auto params = [](schema::Candidate::Reader c) {
    std::map<std::string, std::string> p;
    for (auto x : c.getParams())
      p[x.getName().cStr()] = x.getValue().cStr();
    return p;
  };
  auto child = params(v.getCandidate());
  auto parent = params(r.getVertices()[static_cast<unsigned>(v.getParent())].getCandidate());
  std::string kind;
  for (const auto& [k, value] : child) {
    if (k == "vmem_limit_bytes" || (parent.count(k) && parent[k] == value))
      continue;
    char* end = nullptr;
    double now = std::strtod(value.c_str(), &end);
    bool number = end && *end == '\0' && parent.count(k);
    if (number)
      kind += k + (now > std::strtod(parent[k].c_str(), nullptr) ? "+," : "-,");
    else
      kind += k + "=" + value + ",";
  }
  return kind;
}

}  // namespace

// A round tries each kind of change once: the same change from a second parent waits for the
// first one's result. Beam 2, rmsnorm's one block size (v5p: also the grid's semantics):
// without the rule this search grows or shrinks the block from both parents in one round.
TEST_F(GraphSupervisor, ARoundTriesEachKindOfChangeOnce) {
  auto o = optimize(spawn(), {.mode = "graph", .budget = 12, .beam = 2, .branching = 2,
                              .chip = "v5p"});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  std::map<unsigned, std::set<std::string>> kinds;
  for (auto v : r.getVertices()) {
    if (v.getParent() < 0)
      continue;
    auto kind = change_of(r, v);
    EXPECT_TRUE(kinds[v.getRound()].insert(kind).second)
        << "round " << v.getRound() << " tries " << kind << " twice";
  }
  // Deferred, not dropped: the search still spends its budget over several rounds.
  EXPECT_GE(kinds.size(), 3u);
  EXPECT_EQ(r.getVertices().size(), 12u) << r.getStopReason().cStr();
}

namespace {

// Vertices a round expanded although an earlier vertex known then was the same kernel
// (kernel_params) and not slower: the planner's moves from them make that kernel's
// children again under other parameters.
std::set<unsigned> repeated_kernels_expanded(schema::OptimizeResult::Reader r) {
  auto vs = r.getVertices();
  std::set<unsigned> out;
  for (auto c : vs) {
    if (c.getParent() < 0)
      continue;
    auto i = static_cast<unsigned>(c.getParent());
    auto kernel = kernel_params(vs[i].getCandidate().getSource().cStr());
    for (unsigned j = 0; j < vs.size(); ++j) {
      auto other = vs[j];
      if (j == i || other.getRound() >= c.getRound() || !other.getCorrect() ||
          kernel_params(other.getCandidate().getSource().cStr()) != kernel)
        continue;
      if (other.getTimeUs() < vs[i].getTimeUs() ||
          (other.getTimeUs() == vs[i].getTimeUs() && j < i))
        out.insert(i);
    }
  }
  return out;
}

}  // namespace

// A kernel is expanded through one vertex: v5p's grid semantics, a choice the stand-in's
// kernels do not depend on when it reports structures, makes a vertex that is its parent's
// kernel again; its moves would remake the parent's children. Without structures (no
// fingerprint) the same search expands such vertices: the scenario exercises the rule.
TEST_F(GraphSupervisor, AKernelIsExpandedThroughOneVertexOnly) {
  search_settings s{.mode = "graph", .budget = 16, .beam = 2, .branching = 3, .chip = "v5p"};
  auto blind = optimize(spawn(), s);
  ASSERT_TRUE(blind.result) << messages::message_of(blind.error);
  EXPECT_FALSE(repeated_kernels_expanded(blind.r()).empty());
  node->structure = true;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  EXPECT_EQ(repeated_kernels_expanded(r), std::set<unsigned>{});
  // The same best kernel: the moves it left out only remade kernels it had.
  auto best_of = [](schema::OptimizeResult::Reader x) {
    return x.getVertices()[static_cast<unsigned>(x.getBest())].getTimeUs();
  };
  ASSERT_GE(r.getBest(), 0);
  EXPECT_EQ(best_of(r), best_of(blind.r()));
  for (auto v : r.getVertices()) {
    if (v.getCorrect()) {
      EXPECT_TRUE(v.getResult().getHasStructure()) << "vertex " << v.getIndex();
    }
  }
}

namespace {

// Each round's children, in vertex order, by round.
std::map<unsigned, std::vector<unsigned>> rounds_of(schema::OptimizeResult::Reader r) {
  std::map<unsigned, std::vector<unsigned>> out;
  for (auto v : r.getVertices())
    out[v.getRound()].push_back(v.getIndex());
  return out;
}

double best_time(schema::OptimizeResult::Reader r) {
  return r.getBest() < 0 ? 0 : r.getVertices()[static_cast<unsigned>(r.getBest())].getTimeUs();
}

}  // namespace

// The stand-in's times make a chain toward block 16: every shrink of a block is faster. After
// a round that made the best vertex, the next round is one child of it (the planner's first
// new move); after a round that found nothing faster, breadth again. On the chain the dives
// reach a faster kernel with the same budget than breadth every round does.
TEST_F(GraphSupervisor, AFasterVertexIsFollowedByADive) {
  search_settings s{.mode = "graph", .task = "matmul", .budget = 12, .beam = 2, .branching = 3};
  node->best_block = 16;
  auto o = optimize(spawn(), s);
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto r = o.r();
  auto vs = r.getVertices();
  ASSERT_EQ(vs.size(), 12u) << r.getStopReason().cStr();
  auto rounds = rounds_of(r);
  unsigned made = 0, dives = 0, breadth = 0;  // vertices before the round
  int best = -1;                               // the best of them (first on ties)
  unsigned best_round = 0;
  for (auto& [round, children] : rounds) {
    if (round > 0) {
      bool dive = best >= 0 && best_round == round - 1;
      if (dive) {
        ++dives;
        ASSERT_EQ(children.size(), 1u) << "round " << round;
        EXPECT_EQ(vs[children[0]].getParent(), best) << "round " << round;
      } else {
        // Breadth: the round takes what the budget allows it (half of what is left).
        unsigned left = s.budget - made;
        unsigned share = left - left / 2;
        if (share >= 2) {
          ++breadth;
          EXPECT_GE(children.size(), 2u) << "round " << round;
        }
      }
    }
    for (auto c : children) {
      ++made;
      if (vs[c].getCorrect() && (best < 0 || vs[c].getTimeUs() < vs[best].getTimeUs())) {
        best = static_cast<int>(c);
        best_round = round;
      }
    }
  }
  EXPECT_GE(dives, 5u);
  EXPECT_GE(breadth, 1u);
  EXPECT_EQ(best, r.getBest());
  // Breadth every round: the same budget ends slower.
  s.dive = false;
  auto wide = optimize(spawn(), s);
  ASSERT_TRUE(wide.result) << messages::message_of(wide.error);
  auto w = wide.r();
  EXPECT_EQ(w.getVertices().size(), 12u);
  EXPECT_LT(w.getRounds(), r.getRounds());
  EXPECT_LT(best_time(r), best_time(w));
  EXPECT_GE(rounds_of(w)[1].size(), 2u);
}

// A round whose selected vertices all have no new move (each marked exhausted) selects again
// among the vertices still open: a graph search ends `exhausted` only when every correct
// vertex is. rmsnorm's one block, fastest whole (1024 rows): the beam of one keeps picking
// vertices whose moves were all made from others.
TEST_F(GraphSupervisor, ItEndsExhaustedOnlyWhenEveryVertexIs) {
  node->best_block = 1024;
  for (bool dive : {true, false}) {
    auto o = optimize(spawn(), {.mode = "graph", .budget = 40, .beam = 1, .branching = 2,
                                .dive = dive});
    ASSERT_TRUE(o.result) << messages::message_of(o.error);
    auto r = o.r();
    ASSERT_EQ(std::string(r.getStopReason().cStr()), "exhausted") << "dive " << dive;
    for (auto v : r.getVertices()) {
      if (v.getCorrect()) {
        EXPECT_TRUE(v.getExhausted()) << "dive " << dive << ": vertex " << v.getIndex();
      }
    }
  }
}

// A change measured faster on one branch is tried on another branch's vertex with the values
// it set (the planner's mergeFinding): with the stand-in's separable times (each block away
// from 16 costs alike), block_k shrunk from vertex 1 and block_m shrunk from vertex 1 are two
// siblings; their merge is faster than both, a kernel no single move from either reaches.
TEST_F(GraphSupervisor, AChangeFoundOnOneBranchIsMergedIntoAnother) {
  node->best_block = 16;
  auto o = optimize(spawn(), {.mode = "graph", .task = "matmul", .budget = 16, .beam = 2,
                              .branching = 3});
  ASSERT_TRUE(o.result) << messages::message_of(o.error);
  auto vs = o.r().getVertices();
  auto params = [&](unsigned i) {
    nlohmann::json p = nlohmann::json::object();
    for (auto x : vs[i].getCandidate().getParams())
      if (std::string(x.getName().cStr()) != "vmem_limit_bytes")
        p[x.getName().cStr()] = nlohmann::json::parse(x.getValue().cStr());
    return p;
  };
  auto ancestor = [&](int a, int v) {
    for (; v >= 0; v = vs[static_cast<unsigned>(v)].getParent())
      if (v == a)
        return true;
    return false;
  };
  unsigned merges = 0, across = 0, faster = 0;
  for (unsigned m = 0; m < vs.size(); ++m) {
    if (std::string(vs[m].getCandidate().getStrategy().cStr()).rfind("mergeFinding", 0) != 0)
      continue;
    ++merges;
    int parent = vs[m].getParent();
    ASSERT_GE(parent, 0);
    auto mine = params(m), from = params(static_cast<unsigned>(parent));
    // The donor: an earlier vertex faster than its parent whose change is the merge's.
    for (unsigned d = 0; d < m; ++d) {
      int dp = vs[d].getParent();
      if (dp < 0 || !vs[d].getCorrect() || vs[d].getTimeUs() >= vs[static_cast<unsigned>(dp)].getTimeUs())
        continue;
      auto dv = params(d), dpv = params(static_cast<unsigned>(dp));
      bool same = true, any = false;
      for (auto& [k, v] : dv.items())
        if (dpv[k] != v) {
          any = true;
          same = same && mine[k] == v && from[k] != v;
        }
      for (auto& [k, v] : mine.items())
        if (from[k] != v)
          same = same && dv[k] == v && dpv[k] != v;
      if (!any || !same || ancestor(static_cast<int>(d), parent))
        continue;
      ++across;
      if (vs[m].getTimeUs() < vs[static_cast<unsigned>(parent)].getTimeUs() &&
          vs[m].getTimeUs() < vs[d].getTimeUs())
        ++faster;
      break;
    }
  }
  EXPECT_GE(merges, 1u);
  EXPECT_GE(across, 1u);
  EXPECT_GE(faster, 1u);
}
