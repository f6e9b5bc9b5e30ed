// The expert brain's planner, implementer, debugger and playbook on a small real template
// (tests/agents/expert/scale_template): what each answers for matched and unmatched
// references, history with a diagnosis, failed evaluations of each error class.
#include "agents/expert/expert_brains.hpp"
#include "agents/expert/move_evidence.hpp"
#include "agents/expert/playbook.hpp"
#include "agents/expert/block_size.hpp"
#include "config/chip_loader.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "messages/content_hash.hpp"
#include "tests/agents/expert/scale_template.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

using namespace maxkernel;
namespace ex = agents::expert;

namespace {

std::vector<ex::template_ptr> templates() { return {std::make_shared<tests::scale_template>()}; }

config::chip v5e() {
  config::chip c;
  config::spec_error e;
  EXPECT_TRUE(config::load_chip("v5e", c, e)) << e.what();
  return c;
}

struct planner_fixture {
  capnp::MallocMessageBuilder msg;
  schema::PlannerRequest::Builder req = msg.initRoot<schema::PlannerRequest>();
  explicit planner_fixture(const std::string& prim, int64_t rows = 1024, int64_t cols = 2048) {
    req.setSchemaVersion(schema::SCHEMA_VERSION);
    req.getSpec().setName("t");
    req.setChip("v5e");
    tests::build_graph(req.initAnalysis(), prim, rows, cols);
  }
};

nlohmann::json params_of(schema::Candidate::Reader c) {
  nlohmann::json p;
  for (auto x : c.getParams())
    p[x.getName().cStr()] = nlohmann::json::parse(x.getValue().cStr());
  return p;
}

// A first candidate through the implementer, as the planner's first step asks.
template <class Put>
void first_candidate(planner_fixture& f, Put put) {
  capnp::MallocMessageBuilder pm;
  auto plan = pm.initRoot<schema::Plan>();
  ASSERT_TRUE(ex::make_expert_planner(templates())->plan(f.req.asReader(), plan).ok());
  ASSERT_GT(plan.getSteps().size(), 0u);
  capnp::MallocMessageBuilder im;
  auto ireq = im.initRoot<schema::ImplementRequest>();
  ireq.setSpec(f.req.getSpec().asReader());
  ireq.setAnalysis(f.req.getAnalysis().asReader());
  ireq.setStep(plan.getSteps()[0].asReader());
  ireq.setChip("v5e");
  capnp::MallocMessageBuilder rm;
  auto reply = rm.initRoot<schema::ImplementReply>();
  auto s = ex::make_expert_implementer(templates())->implement(ireq.asReader(), reply);
  ASSERT_TRUE(s.ok()) << s.message;
  put(reply.getCandidate().asReader());
}

// A search's history as the planner reads it: each candidate of the scale template with its
// parent and its (correct) time.
struct history_node {
  const char* id;
  const char* parent;
  nlohmann::json params;
  double us;
};

nlohmann::json with(nlohmann::json p, const char* k, nlohmann::json v) {
  p[k] = std::move(v);
  return p;
}

void set_history(planner_fixture& f, const std::vector<history_node>& nodes) {
  auto history = f.req.initHistory(static_cast<unsigned>(nodes.size()));
  for (unsigned i = 0; i < nodes.size(); ++i) {
    auto c = history[i].initCandidate();
    c.setId(nodes[i].id);
    c.setParentId(nodes[i].parent);
    c.setTemplate("scale");
    auto list = c.initParams(static_cast<unsigned>(nodes[i].params.size()));
    unsigned k = 0;
    for (const auto& [name, v] : nodes[i].params.items()) {
      list[k].setName(name);
      list[k].setValue(v.dump());
      ++k;
    }
    auto r = history[i].initResult();
    r.setCorrect(true);
    r.setHasProfile(true);
    r.getProfile().setTimeUs(nodes[i].us);
  }
}

// The plan's steps as "move name=value ...", with " (hurt)" where the rationale says the
// change kept hurting; every step must be from `parent`.
std::vector<std::string> plan_steps(planner_fixture& f, const char* parent) {
  f.req.setMaxSteps(8);
  capnp::MallocMessageBuilder pm;
  auto plan = pm.initRoot<schema::Plan>();
  EXPECT_TRUE(ex::make_expert_planner(templates())->plan(f.req.asReader(), plan).ok());
  std::vector<std::string> moves;
  for (auto s : plan.getSteps()) {
    EXPECT_EQ(std::string(s.getParentId().cStr()), parent);
    std::string m = s.getMove().cStr();
    for (auto ch : s.getChanges())
      m += std::string(" ") + ch.getName().cStr() + "=" + ch.getValue().cStr();
    if (std::string(s.getRationale().cStr()).find("never made a candidate faster") !=
        std::string::npos)
      m += " (hurt)";
    moves.push_back(m);
  }
  return moves;
}

// The scale template's match of the fixture's reference.
ex::template_match scale_match(planner_fixture& f, const tests::scale_template& t) {
  ex::graph_view g(f.req.getAnalysis().asReader());
  return *t.match(g, f.req.getSpec().asReader());
}

nlohmann::json first_params(planner_fixture& f) {
  capnp::MallocMessageBuilder cm;
  first_candidate(f, [&](schema::Candidate::Reader c) { cm.setRoot(c); });
  return params_of(cm.getRoot<schema::Candidate>());
}

}  // namespace

// A change tried twice from the search's candidates and slower both times is offered after
// the moves not known to hurt; tried once, it keeps its place.
TEST(ExpertPlanner, AChangeThatKeepsHurtingIsOfferedLast) {
  auto plan_from = [](bool hurt_twice) {
    planner_fixture f("mul");
    auto root = first_params(f);
    auto c2 = with(root, "block_rows", 128);
    set_history(f, {
        {"r", "", root, 100},
        {"c1", "r", with(root, "block_cols", 1024), 120},  // cols+: slower
        {"c2", "r", c2, 90},                              // rows-: faster
        {"c3", "c2", with(c2, "block_cols", 1024), hurt_twice ? 95.0 : 85.0},
        {"c4", "c2", with(c2, "grid_order", "cols"), 80},  // the best
    });
    return plan_steps(f, "c4");
  };
  auto hurt = plan_from(true);
  ASSERT_GE(hurt.size(), 3u);
  EXPECT_EQ(hurt.back(), "growBlock block_cols=1024 (hurt)");
  for (size_t i = 0; i + 1 < hurt.size(); ++i)
    EXPECT_EQ(hurt[i].find("(hurt)"), std::string::npos) << hurt[i];
  // With c3 faster than its parent, block_cols+ helped once: no move carries the mark, and
  // it is offered first, as a merge of c3's finding (block_cols 1024) into c4.
  auto helped = plan_from(false);
  for (const auto& m : helped)
    EXPECT_EQ(m.find("(hurt)"), std::string::npos) << m;
  ASSERT_GE(helped.size(), 2u);
  EXPECT_EQ(helped[0], "mergeFinding block_cols=1024");
}

// A change that made one branch faster is offered on another branch's candidate, with the
// values it set, before the blind exploration; the largest gain first; none for a change
// that was slower, or that the candidate already has.
TEST(ExpertPlanner, AChangeFasterOnOneBranchIsMergedIntoAnother) {
  planner_fixture f("mul");
  auto root = first_params(f);
  auto a = with(root, "block_rows", 128);
  auto b = with(root, "grid_order", "cols");
  auto b2 = with(b, "block_cols", 1024);
  set_history(f, {
      {"r", "", root, 100},
      {"a", "r", a, 90},                                  // rows 128: 10% faster
      {"b", "r", b, 80},                                  // grid_order cols: 20% faster
      {"b2", "b", b2, 78},                                // cols 1024 from b: 2.5% faster
      {"b3", "b", with(b, "block_rows", 64), 85},         // rows 64 from b: slower
  });
  f.req.setParentId("a");
  auto steps = plan_steps(f, "a");
  ASSERT_GE(steps.size(), 3u);
  EXPECT_EQ(steps[0], "mergeFinding grid_order=\"cols\"");
  EXPECT_EQ(steps[1], "mergeFinding block_cols=1024");
  for (size_t i = 2; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].find("mergeFinding"), std::string::npos) << steps[i];
  }
  // From b2, which has both of b's findings already, only a's is new.
  f.req.setParentId("b2");
  auto from_b2 = plan_steps(f, "b2");
  ASSERT_GE(from_b2.size(), 1u);
  EXPECT_EQ(from_b2[0], "mergeFinding block_rows=128");
  EXPECT_EQ(std::count_if(from_b2.begin(), from_b2.end(),
                          [](const std::string& m) { return m.rfind("mergeFinding", 0) == 0; }),
            1);
}


TEST(ExpertPlanner, FirstStepInstantiatesTheMatchingTemplate) {
  planner_fixture f("mul");
  capnp::MallocMessageBuilder pm;
  auto plan = pm.initRoot<schema::Plan>();
  ASSERT_TRUE(ex::make_expert_planner(templates())->plan(f.req.asReader(), plan).ok());
  EXPECT_FALSE(plan.getNoTemplate());
  ASSERT_EQ(plan.getSteps().size(), 1u);
  auto step = plan.getSteps()[0];
  EXPECT_EQ(std::string(step.getMove().cStr()), "template");
  EXPECT_EQ(std::string(step.getTemplate().cStr()), "scale");
  EXPECT_NE(std::string(step.getRationale().cStr()).find("x[1024x2048] * 2.0"),
            std::string::npos);
  EXPECT_NE(std::string(step.getExpectedEffect().cStr()).find("VMEM"), std::string::npos);
}

TEST(ExpertPlanner, NoTemplateIsAnHonestAnswer) {
  planner_fixture f("exp");
  capnp::MallocMessageBuilder pm;
  auto plan = pm.initRoot<schema::Plan>();
  ASSERT_TRUE(ex::make_expert_planner(templates())->plan(f.req.asReader(), plan).ok());
  EXPECT_TRUE(plan.getNoTemplate());
  EXPECT_EQ(plan.getSteps().size(), 0u);
  EXPECT_NE(std::string(plan.getMessage().cStr()).find("exp"), std::string::npos);
  EXPECT_NE(std::string(plan.getMessage().cStr()).find("scale"), std::string::npos);
}

TEST(ExpertPlanner, MovesFollowTheDiagnosisOfTheBestCandidate) {
  planner_fixture f("mul");
  auto history = f.req.initHistory(1);
  first_candidate(f, [&](schema::Candidate::Reader c) { history[0].setCandidate(c); });
  auto result = history[0].initResult();
  result.setCorrect(true);
  result.setHasProfile(true);
  result.getProfile().setTimeUs(100);
  history[0].setHasDiagnosis(true);
  auto diag = history[0].initDiagnosis();
  diag.setBound("overhead");
  diag.setTimeUs(100);
  diag.setRooflineUs(20);
  diag.setHeadroom(0.2);
  auto s = diag.initSuggestions(1)[0];
  s.setKind(schema::SuggestionKind::GROW_BLOCK);
  s.setCallIndex(0);
  s.setAxis(1);  // the cols axis
  s.setFactor(2);
  s.setRationale("overhead-bound: 32 steps along axis 1");
  f.req.setMaxSteps(4);
  capnp::MallocMessageBuilder pm;
  auto plan = pm.initRoot<schema::Plan>();
  ASSERT_TRUE(ex::make_expert_planner(templates())->plan(f.req.asReader(), plan).ok());
  ASSERT_EQ(plan.getSteps().size(), 4u);
  auto first = plan.getSteps()[0];
  EXPECT_EQ(std::string(first.getMove().cStr()), "growBlock");
  EXPECT_EQ(std::string(first.getParentId().cStr()),
            std::string(history[0].getCandidate().getId().cStr()));
  ASSERT_EQ(first.getChanges().size(), 1u);
  EXPECT_EQ(std::string(first.getChanges()[0].getName().cStr()), "block_cols");
  EXPECT_EQ(std::string(first.getChanges()[0].getValue().cStr()), "1024");
  EXPECT_NE(std::string(first.getRationale().cStr()).find("overhead-bound at 20%"),
            std::string::npos);
  // Scores never increase down the plan.
  for (unsigned i = 1; i < plan.getSteps().size(); ++i)
    EXPECT_LE(plan.getSteps()[i].getScore(), plan.getSteps()[i - 1].getScore());
}

TEST(MoveEvidence, SignaturesNameTheChangedParametersAndTheirDirection) {
  nlohmann::json a = {{"block_k", 512}, {"block_m", 256}, {"order", "m"}, {"vmem_limit_bytes", 1}};
  auto b = a;
  b["block_k"] = 1024;
  b["vmem_limit_bytes"] = 2;
  EXPECT_EQ(ex::move_signature(a, b), "block_k+");
  b["order"] = "n";
  b["block_m"] = 128;
  EXPECT_EQ(ex::move_signature(a, b), "block_k+,block_m-,order=\"n\"");
  // The VMEM limit alone is no move.
  auto c = a;
  c["vmem_limit_bytes"] = 5;
  EXPECT_EQ(ex::move_signature(a, c), "");
}

// A change tried twice from the search's candidates and slower both times is offered after
// the moves not known to hurt; tried once, it keeps its place.
TEST(Playbook, AtLeastThreeDistinctValidChildren) {
  planner_fixture f("mul");
  tests::scale_template t;
  auto m = scale_match(f, t);
  auto chip = v5e();
  auto parent = t.initial_params(m, chip);
  auto moves = ex::playbook_moves(t, m, parent, chip, nullptr, {});
  ASSERT_GE(moves.size(), 3u);
  std::set<std::string> keys;
  for (const auto& mv : moves) {
    EXPECT_LE(t.vmem_bytes(m, mv.params), ex::vmem_limit(mv.params, chip)) << mv.name;
    EXPECT_NE(mv.params, parent);
    EXPECT_FALSE(mv.changes.empty());
    keys.insert(mv.params.dump());
    std::string src, err;
    EXPECT_TRUE(t.render(m, mv.params, src, err)) << err;
  }
  EXPECT_EQ(keys.size(), moves.size());
  // Already-tried children are not offered again.
  std::set<std::string> seen;
  for (const auto& mv : moves)
    seen.insert(ex::params_key("scale", mv.params));
  // With every near child tried, the playbook jumps further (blocks x4 and /4), never back.
  for (const auto& mv : ex::playbook_moves(t, m, parent, chip, nullptr, ex::search_so_far{seen})) {
    EXPECT_EQ(seen.count(ex::params_key("scale", mv.params)), 0u) << mv.params.dump();
    EXPECT_NE(mv.params, parent);
  }
}

// A block step tried and timed exactly as its parent (the model prices block_rows 256 and 512
// alike) is a plateau: the playbook offers the step after it (1024) rather than nothing; a
// step that was slower or faster, or not timed, is not walked past.
TEST(Playbook, APlateauIsWalkedOneStepFurther) {
  planner_fixture f("mul", 4096, 2048);
  tests::scale_template t;
  auto m = scale_match(f, t);
  auto chip = v5e();
  nlohmann::json parent = {{"block_rows", 256}, {"block_cols", 512}, {"grid_order", "rows"}};
  auto rows_grown = [&](double tried_us) {
    ex::search_so_far known;
    known.parent_us = 100;
    auto tried = with(parent, "block_rows", 512);
    known.seen.insert(ex::params_key("scale", tried));
    if (tried_us > 0)
      known.timed[ex::params_key("scale", tried)] = tried_us;
    std::vector<int64_t> out;
    for (const auto& mv : ex::playbook_moves(t, m, parent, chip, nullptr, known))
      if (mv.name == "growBlock" && mv.changes.contains("block_rows")) {
        out.push_back(mv.changes["block_rows"].get<int64_t>());
        if (out.back() == 1024)
          EXPECT_NE(mv.rationale.find("plateau"), std::string::npos) << mv.rationale;
      }
    return out;
  };
  EXPECT_EQ(rows_grown(100.0), std::vector<int64_t>{1024});
  // Slower, faster or failed: the step was a step; growing rows is not offered again (the
  // x4 jump only comes in a small space, which this is not).
  EXPECT_EQ(rows_grown(120.0), std::vector<int64_t>{});
  EXPECT_EQ(rows_grown(80.0), std::vector<int64_t>{});
  EXPECT_EQ(rows_grown(0), std::vector<int64_t>{});
}

TEST(Playbook, GrowingPastTheScopedLimitRaisesItWithinTheCore) {
  planner_fixture f("mul", 8192, 8192);
  tests::scale_template t;
  auto m = scale_match(f, t);
  auto chip = v5e();
  // 2048 x 4096 f32 blocks, double-buffered in and out: 128 MiB, beyond any core.
  nlohmann::json big = {{"block_rows", 2048}, {"block_cols", 4096}, {"grid_order", "rows"}};
  EXPECT_FALSE(ex::fit_vmem(t, m, big, chip));
  // 512 x 4096: 32 MiB > v5e's 16 MiB scoped default, < its 128 MiB VMEM.
  nlohmann::json mid = {{"block_rows", 512}, {"block_cols", 4096}, {"grid_order", "rows"}};
  ASSERT_TRUE(ex::fit_vmem(t, m, mid, chip));
  EXPECT_GE(mid["vmem_limit_bytes"].get<int64_t>(), t.vmem_bytes(m, mid));
  EXPECT_LE(mid["vmem_limit_bytes"].get<int64_t>(), static_cast<int64_t>(chip.vmem_bytes));
}

namespace {

struct debug_fixture {
  planner_fixture f;
  capnp::MallocMessageBuilder msg;
  schema::DebugRequest::Builder req = msg.initRoot<schema::DebugRequest>();
  debug_fixture(schema::ErrorClass cls, const std::string& message, nlohmann::json params = {},
                int64_t rows = 1024)
    : f("mul", rows) {
    req.setSpec(f.req.getSpec().asReader());
    req.setAnalysis(f.req.getAnalysis().asReader());
    req.setChip("v5e");
    req.setAttempt(1);
    req.setMaxAttempts(3);
    first_candidate(f, [&](schema::Candidate::Reader c) { req.setCandidate(c); });
    if (!params.is_null()) {
      auto list = req.getCandidate().initParams(static_cast<unsigned>(params.size()));
      unsigned i = 0;
      for (const auto& [k, v] : params.items()) {
        list[i].setName(k);
        list[i++].setValue(v.dump());
      }
    }
    auto phase = req.initResult().initPhases(1)[0];
    phase.setStatus(schema::Status::FAILED);
    phase.setErrorClass(cls);
    phase.setMessage(message);
  }
  schema::DebugReply::Reader run(capnp::MallocMessageBuilder& out) {
    auto reply = out.initRoot<schema::DebugReply>();
    auto s = ex::make_expert_debugger(templates())->debug(req.asReader(), reply);
    EXPECT_TRUE(s.ok()) << s.message;
    return reply.asReader();
  }
};

}  // namespace

TEST(ExpertDebugger, VmemOomRaisesTheLimitThenShrinks) {
  debug_fixture d(schema::ErrorClass::VMEM_OOM, "needs 40 MiB of VMEM");
  capnp::MallocMessageBuilder out;
  auto r = d.run(out);
  ASSERT_TRUE(r.getRepaired()) << r.getReason().cStr();
  std::string fix = r.getFix().cStr();
  EXPECT_NE(fix.find("raise vmem_limit_bytes"), std::string::npos) << fix;
  EXPECT_EQ(std::string(r.getCandidate().getParentId().cStr()),
            std::string(d.req.getCandidate().getId().cStr()));
  EXPECT_EQ(std::string(r.getCandidate().getId().cStr()),
            messages::sha256_hex(r.getCandidate().getSource().cStr()));
  // The same fix is not offered twice on one lineage: the next is a smaller block.
  d.req.initTried(1).set(0, fix);
  capnp::MallocMessageBuilder out2;
  auto r2 = d.run(out2);
  ASSERT_TRUE(r2.getRepaired());
  EXPECT_NE(std::string(r2.getFix().cStr()).find("shrink block_cols 512 -> 256"),
            std::string::npos)
    << r2.getFix().cStr();
}

TEST(ExpertDebugger, HostOutOfMemoryShrinksTheLargestBlock) {
  debug_fixture d(schema::ErrorClass::RESOURCE_LIMIT,
                  "JaxRuntimeError: INTERNAL: Error dispatching computation: Out of memory "
                  "allocating 1207959552 bytes.");
  capnp::MallocMessageBuilder out;
  auto r = d.run(out);
  ASSERT_TRUE(r.getRepaired()) << r.getReason().cStr();
  EXPECT_NE(std::string(r.getFix().cStr()).find("shrink block_cols 512 -> 256"),
            std::string::npos)
    << r.getFix().cStr();
  // Another resource limit (the CPU budget) is not a block-size problem.
  debug_fixture cpu(schema::ErrorClass::RESOURCE_LIMIT, "spent its 30 CPU seconds");
  capnp::MallocMessageBuilder out2;
  EXPECT_FALSE(cpu.run(out2).getRepaired());
}

TEST(ExpertDebugger, BlockShapeErrorsRealignBlocks) {
  debug_fixture d(schema::ErrorClass::LOWER_BLOCK_SHAPE, "block shape (200, 300) not divisible",
                  {{"block_rows", 192}, {"block_cols", 512}, {"grid_order", "rows"}}, 1536);
  capnp::MallocMessageBuilder out;
  auto r = d.run(out);
  ASSERT_TRUE(r.getRepaired()) << r.getReason().cStr();
  EXPECT_NE(std::string(r.getFix().cStr()).find("realign"), std::string::npos);
  auto p = params_of(r.getCandidate());
  EXPECT_EQ(p["block_rows"].get<int64_t>(), 128);  // 192 -> a lane multiple dividing 1536
  EXPECT_EQ(p["block_cols"].get<int64_t>(), 512);
}

TEST(ExpertDebugger, GivesUpWithAReason) {
  debug_fixture d(schema::ErrorClass::REWARD_HACK, "read the reference");
  capnp::MallocMessageBuilder out;
  auto r = d.run(out);
  EXPECT_FALSE(r.getRepaired());
  EXPECT_NE(std::string(r.getReason().cStr()).find("rewardHack"), std::string::npos);
  // A kernel that no template rendered is not the expert's to repair.
  debug_fixture hand(schema::ErrorClass::MISMATCH, "values differ");
  hand.req.getCandidate().setTemplate("");
  capnp::MallocMessageBuilder out2;
  auto r2 = hand.run(out2);
  EXPECT_FALSE(r2.getRepaired());
  EXPECT_NE(std::string(r2.getReason().cStr()).find("not rendered from an expert template"),
            std::string::npos);
  // Past the attempt budget.
  debug_fixture late(schema::ErrorClass::VMEM_OOM, "oom");
  late.req.setAttempt(4);
  capnp::MallocMessageBuilder out3;
  EXPECT_FALSE(late.run(out3).getRepaired());
}

TEST(ExpertImplementer, MovesApplyToTheParentsParams) {
  planner_fixture f("mul");
  capnp::MallocMessageBuilder cm;
  first_candidate(f, [&](schema::Candidate::Reader c) { cm.setRoot(c); });
  auto parent = cm.getRoot<schema::Candidate>();
  capnp::MallocMessageBuilder im;
  auto req = im.initRoot<schema::ImplementRequest>();
  req.setSpec(f.req.getSpec().asReader());
  req.setAnalysis(f.req.getAnalysis().asReader());
  req.setChip("v5e");
  req.setParent(parent.asReader());
  req.setHasParent(true);
  auto step = req.initStep();
  step.setMove("reorderGrid");
  auto ch = step.initChanges(1)[0];
  ch.setName("grid_order");
  ch.setValue("\"cols\"");
  capnp::MallocMessageBuilder rm;
  auto reply = rm.initRoot<schema::ImplementReply>();
  ASSERT_TRUE(ex::make_expert_implementer(templates())->implement(req.asReader(), reply).ok());
  auto c = reply.getCandidate();
  auto p = params_of(c);
  EXPECT_EQ(p["grid_order"], "cols");
  EXPECT_EQ(p["block_rows"], params_of(parent)["block_rows"]);
  EXPECT_EQ(std::string(c.getParentId().cStr()), std::string(parent.getId().cStr()));
  EXPECT_NE(std::string(c.getSource().cStr()).find("cols // bc, rows // br"), std::string::npos);
  // A value of the wrong type (an operator's edit, say) is refused by name, not thrown.
  for (const char* bad : {"\"wide\"", "-4"}) {
    ch.setName("block_rows");
    ch.setValue(bad);
    capnp::MallocMessageBuilder rm3;
    auto s = ex::make_expert_implementer(templates())->implement(
      req.asReader(), rm3.initRoot<schema::ImplementReply>());
    EXPECT_EQ(s.code, messages::error_code::bad_input) << bad;
    EXPECT_NE(s.message.find("block_rows"), std::string::npos) << s.message;
  }
  // A move without a template parent is refused.
  req.setHasParent(false);
  capnp::MallocMessageBuilder rm2;
  auto s = ex::make_expert_implementer(templates())->implement(
    req.asReader(), rm2.initRoot<schema::ImplementReply>());
  EXPECT_EQ(s.code, messages::error_code::bad_input);
}
