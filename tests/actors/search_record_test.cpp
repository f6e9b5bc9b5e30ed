// search_record: the supervisors' bookkeeping of a search (best vertex, planner history,
// OptimizeResult tallies and curve, write-through and resume through the graph file) and
// search_run's stop rules.
#include "actors/search_record.hpp"
#include "actors/search_run.hpp"
#include "search/temp_dir.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <limits>

using namespace maxkernel;
using maxkernel::search::test::temp_dir;

namespace {

struct vertex_args {
  unsigned index;
  int parent = -1;
  schema::VertexState state = schema::VertexState::EVALUATED;
  bool correct = true;
  double time_us = 0;
  std::string id;
  std::vector<std::string> failures = {};
  unsigned evaluations = 1, hits = 0;
  std::string decision = {};  // hitl
  std::string feedback = {};
};

std::string vertex(const vertex_args& a) {
  capnp::MallocMessageBuilder msg;
  auto v = msg.initRoot<schema::Vertex>();
  v.setIndex(a.index);
  v.setParent(a.parent);
  v.setState(a.state);
  v.setCorrect(a.correct);
  v.setTimeUs(a.time_us);
  v.setRooflineUs(a.time_us / 2);
  v.setStrategy(a.parent < 0 ? "template" : "growBlock");
  auto c = v.initCandidate();
  c.setId(a.id);
  c.setSource("def workload(x):\n  return x\n");
  c.setTemplate("matmul");
  auto params = c.initParams(1);
  params[0].setName("bm");
  params[0].setValue("128");
  if (a.state != schema::VertexState::PENDING) {
    v.setHasResult(true);
    v.getResult().setCorrect(true);  // the node's own test; the tester may still fail it
    v.getResult().setHasProfile(a.time_us > 0);
    v.getResult().getProfile().setTimeUs(a.time_us);
  }
  v.setEvaluations(a.evaluations);
  v.setCacheHits(a.hits);
  v.setDecision(a.decision);
  v.setFeedback(a.feedback);
  auto f = v.initAttemptFailures(static_cast<unsigned>(a.failures.size()));
  for (unsigned i = 0; i < a.failures.size(); ++i)
    f.set(i, a.failures[i]);
  return messages::encode(msg);
}

void put(actors::search_record& r, const vertex_args& a) {
  std::string error;
  auto m = messages::decode<schema::Vertex>(vertex(a), error);
  ASSERT_TRUE(m) << error;
  ASSERT_TRUE(r.put(m->root<schema::Vertex>(), error)) << error;
}

struct settings_msg {
  capnp::MallocMessageBuilder msg;
  capnp::MallocMessageBuilder spec_msg;
  settings_msg(unsigned budget = 0, unsigned patience = 0, double target = 0) {
    auto s = msg.initRoot<schema::SearchSettings>();
    s.setMode("graph");
    s.setChip("v6e");
    s.setSeed(7);
    s.setBudgetEvals(budget);
    s.setPatience(patience);
    s.setTargetRoofline(target);
    s.setPolicy("beam");
    spec_msg.initRoot<schema::KernelSpec>().setName("task");
  }
  schema::SearchSettings::Reader settings() { return msg.getRoot<schema::SearchSettings>(); }
  schema::KernelSpec::Reader spec() { return spec_msg.getRoot<schema::KernelSpec>(); }
};

schema::OptimizeResult::Reader result_of(std::optional<messages::decoded_message>& m,
                                         const std::string& bytes) {
  std::string error;
  m = messages::decode<schema::OptimizeResult>(bytes, error);
  EXPECT_TRUE(m) << error;
  return m->root<schema::OptimizeResult>();
}

}  // namespace

TEST(SearchRecord, BestIsTheFastestCorrectEvaluatedVertex) {
  actors::search_record r;
  EXPECT_EQ(r.best(), -1);
  put(r, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});
  put(r, {1, 0, schema::VertexState::FAILED, false, 2.0, "b"});       // faster, not correct
  put(r, {2, 0, schema::VertexState::EVALUATED, true, 8.0, "c"});
  put(r, {3, 0, schema::VertexState::PENDING, false, 0.0, "d"});
  put(r, {4, 2, schema::VertexState::EVALUATED, true, 8.0, "e"});     // a tie: the first wins
  EXPECT_EQ(r.best(), 2);
  EXPECT_DOUBLE_EQ(r.best_time_us(), 8.0);
  EXPECT_EQ(r.evaluated(), 4u);
  EXPECT_EQ(r.find_candidate("c"), 2);
  EXPECT_EQ(r.find_candidate("zz"), -1);
}

TEST(SearchRecord, RefusesAGapInTheIndices) {
  actors::search_record r;
  put(r, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});
  std::string error;
  auto m = messages::decode<schema::Vertex>(vertex({5, 0, schema::VertexState::EVALUATED, true,
                                                    1.0, "x"}),
                                            error);
  EXPECT_FALSE(r.put(m->root<schema::Vertex>(), error));
  EXPECT_NE(error.find("vertex 5"), std::string::npos) << error;
}

TEST(SearchRecord, HistoryLeavesPendingOutAndMarksTesterFailuresIncorrect) {
  actors::search_record r;
  put(r, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});
  put(r, {1, 0, schema::VertexState::FAILED, false, 9.0, "b"});  // node passed, tester failed
  put(r, {2, 0, schema::VertexState::PENDING, false, 0.0, "c"});
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::PlannerRequest>();
  r.fill_history(req);
  auto h = req.getHistory();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(std::string(h[0].getCandidate().getId().cStr()), "a");
  EXPECT_TRUE(h[0].getResult().getCorrect());
  EXPECT_EQ(std::string(h[1].getCandidate().getId().cStr()), "b");
  EXPECT_FALSE(h[1].getResult().getCorrect());
}

// hitl: only what the operator approved can be the best or a parent; feedback and hints
// reach the planner as guidance; the transcript goes into the result.
TEST(SearchRecord, OnlyAcceptedVerticesCountAndTheOperatorGuides) {
  actors::search_record r;
  put(r, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a", {}, 1, 0, "approved", "use bf16"});
  put(r, {1, 0, schema::VertexState::EVALUATED, true, 5.0, "b", {}, 1, 0, "rejected", "too risky"});
  put(r, {2, 0, schema::VertexState::EVALUATED, true, 4.0, "c", {}, 1, 0, "awaiting"});
  put(r, {3, 0, schema::VertexState::EVALUATED, true, 3.0, "d", {}, 1, 0, "edited"});
  put(r, {4, 0, schema::VertexState::EVALUATED, true, 9.0, "e", {}, 1, 0, "approved"});
  EXPECT_EQ(r.best(), 4);
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::PlannerRequest>();
  r.fill_history(req);
  auto h = req.getHistory();
  ASSERT_EQ(h.size(), 5u);
  EXPECT_TRUE(h[0].getResult().getCorrect());
  EXPECT_FALSE(h[1].getResult().getCorrect());
  EXPECT_FALSE(h[2].getResult().getCorrect());
  EXPECT_FALSE(h[3].getResult().getCorrect());
  EXPECT_TRUE(h[4].getResult().getCorrect());
  auto g = req.getGuidance();
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(std::string(g[0].cStr()), "use bf16");
  EXPECT_EQ(std::string(g[1].cStr()), "the operator rejected vertex 1 (growBlock): too risky");
  std::string error;
  ASSERT_TRUE(r.append_transcript("entry-1", error)) << error;
  std::optional<messages::decoded_message> m;
  auto res = result_of(m, r.result_bytes("operator", 5));
  EXPECT_EQ(res.getBest(), 4);
  ASSERT_EQ(res.getTranscript().size(), 1u);
  EXPECT_EQ(res.getTranscript()[0].size(), 7u);
  // The curve follows the accepted best only: 10, 10, 10, 10, 9.
  ASSERT_EQ(res.getBestPerEvaluation().size(), 5u);
  EXPECT_DOUBLE_EQ(res.getBestPerEvaluation()[3], 10.0);
  EXPECT_DOUBLE_EQ(res.getBestPerEvaluation()[4], 9.0);
}

// However large the graph, a PlannerRequest carries whole entries (source, profile) only for
// the best, the vertex it expands and the last few; the others say which kernel and how fast.
TEST(SearchRecord, HistoryIsWholeOnlyForTheBestTheParentAndTheRecent) {
  actors::search_record r;
  for (unsigned i = 0; i < 14; ++i)
    put(r, {i, i ? 0 : -1, schema::VertexState::EVALUATED, true, i == 2 ? 1.0 : 10.0 + i,
            "id" + std::to_string(i)});
  ASSERT_EQ(r.best(), 2);
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::PlannerRequest>();
  r.fill_history(req, "id4");
  auto h = req.getHistory();
  ASSERT_EQ(h.size(), 14u);
  for (unsigned i = 0; i < 14; ++i) {
    bool full = i == 2 || i == 4 || i >= 14 - actors::search_record::full_recent;
    EXPECT_EQ(h[i].getCandidate().getSource().size() > 0, full) << i;
    EXPECT_EQ(std::string(h[i].getCandidate().getId().cStr()), "id" + std::to_string(i));
    EXPECT_EQ(std::string(h[i].getCandidate().getTemplate().cStr()), "matmul");
    EXPECT_EQ(h[i].getCandidate().getParams().size(), 1u);
    EXPECT_TRUE(h[i].getResult().getCorrect());
    EXPECT_DOUBLE_EQ(h[i].getResult().getProfile().getTimeUs(), i == 2 ? 1.0 : 10.0 + i);
  }
}

TEST(SearchRecord, ResultTalliesAndTheBestCurve) {
  actors::search_record r;
  put(r, {0, -1, schema::VertexState::FAILED, false, 0.0, "a", {"lowerBlockShape", "mismatch"},
          3, 1});
  put(r, {1, -1, schema::VertexState::EVALUATED, true, 10.0, "b", {"mismatch"}, 4, 2});
  put(r, {2, 1, schema::VertexState::EVALUATED, true, 12.0, "c", {}, 2, 0});
  put(r, {3, 1, schema::VertexState::EVALUATED, true, 6.0, "d", {}, 2, 0});
  std::optional<messages::decoded_message> m;
  auto res = result_of(m, r.result_bytes("budget", 2));
  EXPECT_EQ(res.getBest(), 3);
  EXPECT_EQ(res.getCandidatesEvaluated(), 4u);
  EXPECT_EQ(res.getEvaluations(), 11u);
  EXPECT_EQ(res.getCacheHits(), 3u);
  EXPECT_EQ(std::string(res.getStopReason().cStr()), "budget");
  EXPECT_EQ(res.getRounds(), 2u);
  ASSERT_EQ(res.getFailures().size(), 2u);
  EXPECT_EQ(std::string(res.getFailures()[0].getFailureClass().cStr()), "lowerBlockShape");
  EXPECT_EQ(res.getFailures()[0].getCount(), 1u);
  EXPECT_EQ(std::string(res.getFailures()[1].getFailureClass().cStr()), "mismatch");
  EXPECT_EQ(res.getFailures()[1].getCount(), 2u);
  auto curve = res.getBestPerEvaluation();
  ASSERT_EQ(curve.size(), 4u);
  EXPECT_DOUBLE_EQ(curve[0], 0.0);
  EXPECT_DOUBLE_EQ(curve[1], 10.0);
  EXPECT_DOUBLE_EQ(curve[2], 10.0);
  EXPECT_DOUBLE_EQ(curve[3], 6.0);
  ASSERT_EQ(res.getVertices().size(), 4u);
}

TEST(SearchRecord, WritesThroughAndResumesFromTheGraphFile) {
  temp_dir dir;
  auto path = dir.file("graphs.sqlite");
  settings_msg s;
  std::string error;
  {
    actors::search_record r;
    ASSERT_TRUE(r.open(path, s.spec(), s.settings(), false, error)) << error;
    EXPECT_FALSE(r.resumed());
    put(r, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});
    put(r, {1, 0, schema::VertexState::PENDING, false, 0.0, "b"});
  }
  {
    actors::search_record r;
    ASSERT_TRUE(r.open(path, s.spec(), s.settings(), true, error)) << error;
    EXPECT_TRUE(r.resumed());
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r.vertex(1).getState(), schema::VertexState::PENDING);
    EXPECT_EQ(r.best(), 0);
    // Graph's frontier asks a resumed record for its vertices' fingerprints (none here: the
    // results carry no structure).
    EXPECT_EQ(r.kernel_fingerprint(0), "");
    EXPECT_EQ(r.kernel_fingerprint(1), "");
  }
  {
    // Without resume the search of that key starts over.
    actors::search_record r;
    ASSERT_TRUE(r.open(path, s.spec(), s.settings(), false, error)) << error;
    EXPECT_FALSE(r.resumed());
    EXPECT_EQ(r.size(), 0u);
  }
}

TEST(SearchRecord, KeyDependsOnSeedModeAndPolicyButNotOnBudget) {
  settings_msg a(10), b(20);
  EXPECT_EQ(actors::search_key(a.spec(), a.settings()), actors::search_key(b.spec(), b.settings()));
  settings_msg c;
  c.msg.getRoot<schema::SearchSettings>().setSeed(8);
  EXPECT_NE(actors::search_key(a.spec(), a.settings()), actors::search_key(c.spec(), c.settings()));
  settings_msg d;
  d.msg.getRoot<schema::SearchSettings>().setMode("auto");
  EXPECT_NE(actors::search_key(a.spec(), a.settings()), actors::search_key(d.spec(), d.settings()));
  settings_msg e;
  e.spec_msg.getRoot<schema::KernelSpec>().setName("other");
  EXPECT_NE(actors::search_key(a.spec(), a.settings()), actors::search_key(e.spec(), e.settings()));
}

// Graph's rounds differ with and without dives, so its searches do not share a key; auto and
// hitl never dive, so the setting does not split theirs.
TEST(SearchRecord, KeyOfAGraphSearchDependsOnDives) {
  settings_msg a, b;
  b.msg.getRoot<schema::SearchSettings>().setDive(false);
  EXPECT_NE(actors::search_key(a.spec(), a.settings()), actors::search_key(b.spec(), b.settings()));
  a.msg.getRoot<schema::SearchSettings>().setMode("auto");
  b.msg.getRoot<schema::SearchSettings>().setMode("auto");
  EXPECT_EQ(actors::search_key(a.spec(), a.settings()), actors::search_key(b.spec(), b.settings()));
}

namespace {

// A search_run over an OptimizeRequest with these settings and no graph file.
std::unique_ptr<actors::search_run> run_with(unsigned budget, unsigned patience, double target) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::OptimizeRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.initSpec().setName("task");
  auto s = req.initSettings();
  s.setMode("auto");
  s.setChip("v6e");
  s.setBudgetEvals(budget);
  s.setPatience(patience);
  s.setTargetRoofline(target);
  auto run = std::make_unique<actors::search_run>();
  std::string error;
  EXPECT_TRUE(run->open(messages::encode(msg), error)) << error;
  return run;
}

}  // namespace

TEST(SearchRun, StopsOnBudget) {
  auto run = run_with(2, 0, 0);
  EXPECT_EQ(run->stop_reason(), "");
  EXPECT_EQ(run->remaining_budget(), 2u);
  put(run->record, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});
  put(run->record, {1, 0, schema::VertexState::PENDING, false, 0.0, "b"});
  EXPECT_EQ(run->stop_reason(), "");  // a pending vertex is not evaluated yet
  put(run->record, {1, 0, schema::VertexState::FAILED, false, 0.0, "b"});
  EXPECT_EQ(run->stop_reason(), "budget");
  EXPECT_EQ(run->remaining_budget(), 0u);
}

// A graph round takes half of what the budget leaves (rounded up): 8 goes 4, 2, 1, 1.
TEST(SearchRun, AGraphRoundTakesHalfOfWhatTheBudgetLeaves) {
  auto run = run_with(8, 0, 0);
  std::vector<unsigned> widths;
  unsigned index = 0;
  while (run->remaining_budget() > 0) {
    unsigned width = run->round_budget();
    widths.push_back(width);
    for (unsigned k = 0; k < width; ++k, ++index)
      put(run->record, {index, static_cast<int>(index) - 1, schema::VertexState::EVALUATED, true, 10.0,
                        "k" + std::to_string(index)});
  }
  EXPECT_EQ(widths, (std::vector<unsigned>{4, 2, 1, 1}));
  EXPECT_EQ(run->round_budget(), 0u);
  // Pending vertices are not spent yet; without a cap a round is not limited.
  auto open = run_with(3, 0, 0);
  put(open->record, {0, -1, schema::VertexState::PENDING, false, 0.0, "a"});
  EXPECT_EQ(open->round_budget(), 2u);
  EXPECT_EQ(run_with(0, 2, 0)->round_budget(), std::numeric_limits<unsigned>::max());
}

TEST(SearchRun, StopsAfterPatienceStepsWithoutAFasterKernel) {
  auto run = run_with(0, 2, 0);
  put(run->record, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});
  run->step_ended();  // an improvement (first correct)
  put(run->record, {1, 0, schema::VertexState::EVALUATED, true, 11.0, "b"});
  run->step_ended();
  EXPECT_EQ(run->stop_reason(), "");
  put(run->record, {2, 0, schema::VertexState::EVALUATED, true, 9.0, "c"});
  run->step_ended();  // faster: the count starts over
  put(run->record, {3, 2, schema::VertexState::EVALUATED, true, 9.0, "d"});
  run->step_ended();
  EXPECT_EQ(run->stop_reason(), "");
  put(run->record, {4, 2, schema::VertexState::EVALUATED, true, 9.5, "e"});
  run->step_ended();
  EXPECT_EQ(run->stop_reason(), "stagnation");
}

TEST(SearchRun, StopsAtTheTargetFractionOfRoofline) {
  auto run = run_with(0, 5, 0.6);
  put(run->record, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});  // roofline 5
  EXPECT_EQ(run->stop_reason(), "");  // 50% of roofline
  auto more = run_with(0, 5, 0.5);
  put(more->record, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});
  EXPECT_EQ(more->stop_reason(), "roofline");
}

TEST(SearchRun, RefusesASearchWithoutAnEnd) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::OptimizeRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.initSettings().setChip("v6e");
  actors::search_run run;
  std::string error;
  EXPECT_FALSE(run.open(messages::encode(msg), error));
  EXPECT_NE(error.find("no end"), std::string::npos) << error;
}

TEST(SearchRecord, ARoundIsRecordedWholeOrNotAtAll) {
  temp_dir dir;
  auto path = dir.file("graphs.sqlite");
  settings_msg s;
  std::string error;
  {
    actors::search_record r;
    ASSERT_TRUE(r.open(path, s.spec(), s.settings(), false, error)) << error;
    put(r, {0, -1, schema::VertexState::EVALUATED, true, 10.0, "a"});
    // The third child names a parent that does not exist yet: the round is refused whole.
    std::vector<std::string> round = {vertex({1, 0, schema::VertexState::PENDING, false, 0, "b"}),
                                      vertex({2, 0, schema::VertexState::PENDING, false, 0, "c"}),
                                      vertex({3, 7, schema::VertexState::PENDING, false, 0, "d"})};
    EXPECT_FALSE(r.put_all(round, error));
    EXPECT_EQ(r.size(), 1u);
    round.pop_back();
    ASSERT_TRUE(r.put_all(round, error)) << error;
    EXPECT_EQ(r.size(), 3u);
    ASSERT_TRUE(r.mark_exhausted(0, error)) << error;
  }
  actors::search_record r;
  ASSERT_TRUE(r.open(path, s.spec(), s.settings(), true, error)) << error;
  ASSERT_EQ(r.size(), 3u);
  EXPECT_TRUE(r.vertex(0).getExhausted());
  EXPECT_DOUBLE_EQ(r.vertex(0).getTimeUs(), 10.0);
  EXPECT_FALSE(r.vertex(1).getExhausted());
}

// The record reads each vertex through a reader kept from when it came in: those stay valid
// while the record grows (its vectors reallocate) and when a vertex is replaced (pending, then
// final), with and without a graph file.
TEST(SearchRecord, VerticesStayReadableAsTheRecordGrowsAndReplacesThem) {
  temp_dir dir;
  for (std::string path : {std::string(), dir.file("graphs.sqlite")}) {
    settings_msg s;
    std::string error;
    actors::search_record r;
    ASSERT_TRUE(r.open(path, s.spec(), s.settings(), false, error)) << error;
    const unsigned rounds = 40, width = 8;
    for (unsigned k = 0; k < rounds; ++k) {
      std::vector<std::string> pending, final_;
      for (unsigned j = 0; j < width; ++j) {
        unsigned i = k * width + j;
        int parent = i == 0 ? -1 : 0;
        std::string id = "v" + std::to_string(i);
        pending.push_back(vertex({i, parent, schema::VertexState::PENDING, false, 0, id}));
        final_.push_back(vertex({i, parent, schema::VertexState::EVALUATED, true,
                                 100.0 + (i * 37) % 101, id}));
      }
      ASSERT_TRUE(r.put_all(pending, error)) << error;
      ASSERT_TRUE(r.put_all(final_, error)) << error;
    }
    ASSERT_EQ(r.size(), rounds * width);
    EXPECT_EQ(r.evaluated(), rounds * width);
    int best = -1;
    for (unsigned i = 0; i < r.size(); ++i) {
      auto v = r.vertex(i);
      ASSERT_EQ(v.getIndex(), i);
      EXPECT_EQ(v.getState(), schema::VertexState::EVALUATED);
      EXPECT_EQ(std::string(v.getCandidate().getId().cStr()), "v" + std::to_string(i));
      EXPECT_EQ(r.find_candidate("v" + std::to_string(i)), static_cast<int>(i));
      if (best < 0 || v.getTimeUs() < r.vertex(static_cast<unsigned>(best)).getTimeUs())
        best = static_cast<int>(i);
    }
    EXPECT_EQ(r.best(), best);
    std::optional<messages::decoded_message> m;
    auto res = result_of(m, r.result_bytes("budget", rounds));
    ASSERT_EQ(res.getVertices().size(), rounds * width);
    EXPECT_EQ(std::string(res.getVertices()[rounds * width - 1].getCandidate().getId().cStr()),
              "v" + std::to_string(rounds * width - 1));
  }
}

TEST(SearchRecord, RefusesBytesThatAreNoMessage) {
  actors::search_record r;
  std::string error;
  EXPECT_FALSE(r.put_all({std::string("12345")}, error));
  EXPECT_NE(error.find("not a message"), std::string::npos) << error;
  EXPECT_FALSE(r.put_all({std::string()}, error));
  EXPECT_EQ(r.size(), 0u);
}
