// The tester's rules (agents/tester): which cases choose_tests asks for on which specs (modes,
// seeds, full or reduced, determinism) and how judge reads the results (passes, failures,
// skips with their reasons, the worst error against the spec's tolerances).
#include "agents/tester.hpp"
#include "tests/agents/tester_requests.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

using namespace maxkernel;
using agents::tester_limits;
using tests::spec_desc;

namespace {

struct plan_holder {
  capnp::MallocMessageBuilder request;
  capnp::MallocMessageBuilder plan;
  bool ok = false;
  std::string error;
  schema::TestPlan::Reader get() { return plan.getRoot<schema::TestPlan>().asReader(); }
};

void make_plan(plan_holder& h, const spec_desc& d, uint64_t seed = 7, bool thorough = false,
               double analysis_flops = 0) {
  auto r = h.request.initRoot<schema::TesterRequest>();
  tests::fill_tester_request(r, d, seed, thorough);
  if (analysis_flops > 0)
    r.initAnalysis().setFlops(analysis_flops);
  h.ok = agents::choose_tests(r.asReader(), h.plan.initRoot<schema::TestPlan>(), h.error);
}

std::vector<std::string> names_of(schema::TestPlan::Reader plan) {
  std::vector<std::string> out;
  for (auto c : plan.getCases())
    out.push_back(c.getName());
  return out;
}

std::optional<schema::TestPlanCase::Reader> find(schema::TestPlan::Reader plan,
                                                 const std::string& name) {
  for (auto c : plan.getCases())
    if (c.getName() == name)
      return c;
  return std::nullopt;
}

using names = std::vector<std::string>;

// ------------------------------------------------------------------------ choose_tests

TEST(ChooseTests, QuickPlanForABf16Matmul) {
  plan_holder h;
  make_plan(h, tests::matmul_desc(512, 256, 512, "bfloat16", 2e-2));
  ASSERT_TRUE(h.ok) << h.error;
  auto plan = h.get();
  EXPECT_EQ(plan.getSchemaVersion(), schema::SCHEMA_VERSION);
  EXPECT_EQ(names_of(plan),
            (names{"fresh inputs", "ragged last blocks", "large magnitudes", "zeros"}));
  for (auto c : plan.getCases()) {
    auto o = c.getOptions();
    EXPECT_FALSE(o.getFull()) << c.getName().cStr();   // quick: reduced sizes
    EXPECT_EQ(o.getChip(), "v5e");
    EXPECT_FALSE(o.getProfileOnly());
    EXPECT_GT(c.getWhy().size(), 40u);
  }
  auto fresh = plan.getCases()[0].getOptions();
  EXPECT_EQ(fresh.getSeeds().size(), tester_limits::fresh_seeds);
  EXPECT_EQ(fresh.getValueMode(), "");
  EXPECT_EQ(fresh.getShapeMode(), "");
  auto ragged = plan.getCases()[1];
  EXPECT_EQ(ragged.getOptions().getShapeMode(), "ragged");
  EXPECT_NE(std::string(ragged.getWhy()).find("K, M, N"), std::string::npos) << ragged.getWhy().cStr();
  auto large = plan.getCases()[2].getOptions();
  EXPECT_EQ(large.getValueMode(), "large");
  EXPECT_DOUBLE_EQ(large.getValueScale(), tester_limits::large_scale);
  EXPECT_EQ(large.getSeeds().size(), tester_limits::mode_seeds);
  EXPECT_EQ(plan.getCases()[3].getOptions().getValueMode(), "zeros");
  EXPECT_EQ(plan.getCases()[3].getOptions().getSeeds().size(), 1u);
  // the why names its seeds
  auto why = std::string(plan.getCases()[0].getWhy());
  EXPECT_NE(why.find(std::to_string(fresh.getSeeds()[0])), std::string::npos) << why;
}

TEST(ChooseTests, LargeMagnitudesOnlyWhenRtolCoversTheOutputsUlps) {
  // bf16 outputs: 2 ulps = 2 * 2^-7 = 0.0156. JAXBench's default 1e-2 is too tight.
  plan_holder tight;
  make_plan(tight, tests::matmul_desc(256, 256, 256, "bfloat16", 1e-2));
  EXPECT_FALSE(find(tight.get(), "large magnitudes"));
  EXPECT_TRUE(find(tight.get(), "zeros"));
  // float32 outputs: 1e-2 is many ulps
  plan_holder f32;
  make_plan(f32, tests::matmul_desc(256, 256, 256, "float32", 1e-2));
  EXPECT_TRUE(find(f32.get(), "large magnitudes"));
  // an absolute-only tolerance never covers a scaled output
  auto d = tests::matmul_desc(256, 256, 256, "float32", 1e-2);
  d.tolerances = {{-1, 1e-2, 0.0}};
  plan_holder absolute;
  make_plan(absolute, d);
  EXPECT_FALSE(find(absolute.get(), "large magnitudes"));
  // a per-output entry wins over the general one
  d.tolerances = {{-1, 1e-2, 0.0}, {0, 1e-2, 1e-3}};
  plan_holder per_output;
  make_plan(per_output, d);
  EXPECT_TRUE(find(per_output.get(), "large magnitudes"));
}

TEST(ChooseTests, NoLargeMagnitudesForDtypesWithoutRange) {
  plan_holder f16;
  make_plan(f16, tests::matmul_desc(256, 256, 256, "float16", 5e-2));
  EXPECT_FALSE(find(f16.get(), "large magnitudes"));
  EXPECT_TRUE(find(f16.get(), "zeros"));
}

TEST(ChooseTests, IntegerAndStructuralInputsGetNoValueModes) {
  spec_desc d;
  d.dims = {{"N", 1024}};
  d.inputs = {{"ids", {"N"}, "int32", true}, {"counts", {"8", "N"}, "int32"}};
  d.outputs = {{{"N"}, "int32"}};
  d.tolerances = {{-1, 0, 0}};
  plan_holder h;
  make_plan(h, d);
  ASSERT_TRUE(h.ok) << h.error;
  EXPECT_EQ(names_of(h.get()), (names{"fresh inputs"}));
}

TEST(ChooseTests, RaggedNeedsAFreeDimOnAFloatInputsLastTwoAxes) {
  // SEQ1 is derived, 128 a literal axis, B only on a 1-D input: nothing is free
  spec_desc d;
  d.dims = {{"B", 4}, {"SEQ", 255}, {"SEQ1", 256}};
  d.derived = {{"SEQ1", "SEQ + 1"}};
  d.inputs = {{"x", {"SEQ1", "128"}}, {"w", {"B"}}, {"lens", {"B"}, "int32", true}};
  d.outputs = {{{"SEQ1", "128"}, "float32"}};
  d.tolerances = {{-1, 1e-3, 1e-3}};
  plan_holder h;
  make_plan(h, d);
  ASSERT_TRUE(h.ok) << h.error;
  EXPECT_FALSE(find(h.get(), "ragged last blocks"));
  // a named dim there makes it free
  d.inputs[0].dims = {"SEQ1", "SEQ"};
  d.outputs[0].first = {"SEQ1", "SEQ"};
  plan_holder named;
  make_plan(named, d);
  auto ragged = find(named.get(), "ragged last blocks");
  ASSERT_TRUE(ragged);
  EXPECT_NE(std::string(ragged->getWhy()).find("(SEQ)"), std::string::npos) << ragged->getWhy().cStr();
}

TEST(ChooseTests, TaskDirectorySpecsNameTheirFreeSizes) {
  auto d = tests::matmul_desc(384, 128, 256, "float32", 1e-2);
  d.named = false;
  plan_holder h;
  make_plan(h, d);
  auto ragged = find(h.get(), "ragged last blocks");
  ASSERT_TRUE(ragged);
  EXPECT_NE(std::string(ragged->getWhy()).find("(128, 256, 384)"), std::string::npos)
      << ragged->getWhy().cStr();
}

TEST(ChooseTests, ThoroughTestsSmallTasksAtFullShapes) {
  plan_holder h;
  make_plan(h, tests::matmul_desc(256, 256, 256, "bfloat16", 2e-2), 7, true);
  ASSERT_TRUE(h.ok) << h.error;
  auto plan = h.get();
  EXPECT_EQ(names_of(plan), (names{"fresh inputs", "ragged last blocks", "large magnitudes",
                                   "zeros", "sparse inputs"}));
  EXPECT_TRUE(plan.getCases()[0].getOptions().getFull());
  EXPECT_EQ(plan.getCases()[0].getOptions().getSeeds().size(), tester_limits::thorough_fresh_seeds);
  EXPECT_FALSE(plan.getCases()[1].getOptions().getFull());   // ragged sizes are reduced ones
  EXPECT_TRUE(plan.getCases()[2].getOptions().getFull());
  EXPECT_EQ(plan.getCases()[2].getOptions().getSeeds().size(), tester_limits::thorough_mode_seeds);
  EXPECT_EQ(plan.getCases()[4].getOptions().getValueMode(), "sparse");
}

TEST(ChooseTests, ThoroughKeepsReducedSizesForLargeTasks) {
  // 2048^2 float32 x 3 arrays = 48 MiB: over the byte limit
  plan_holder big;
  make_plan(big, tests::matmul_desc(2048, 2048, 2048, "float32", 1e-2), 7, true);
  EXPECT_FALSE(big.get().getCases()[0].getOptions().getFull());
  EXPECT_NE(std::string(big.get().getCases()[0].getWhy()).find("reduced"), std::string::npos);
  // small arrays but the analysis counts more flops than the limit
  auto d = tests::matmul_desc(256, 256, 256, "float32", 1e-2);
  d.flops = 0;
  plan_holder heavy;
  make_plan(heavy, d, 7, true, 2 * tester_limits::full_flops);
  EXPECT_FALSE(heavy.get().getCases()[0].getOptions().getFull());
  plan_holder light;
  make_plan(light, d, 7, true, tester_limits::full_flops / 2);
  EXPECT_TRUE(light.get().getCases()[0].getOptions().getFull());
}

TEST(ChooseTests, DeterministicGivenTheSeedAndFreshOtherwise) {
  auto d = tests::matmul_desc(512, 256, 512, "float32", 1e-2);
  plan_holder a, b, c;
  make_plan(a, d, 11, true);
  make_plan(b, d, 11, true);
  make_plan(c, d, 12, true);
  std::set<uint64_t> seeds_a, seeds_c;
  std::vector<uint64_t> list_a, list_b;
  for (auto k : a.get().getCases())
    for (auto s : k.getOptions().getSeeds()) {
      list_a.push_back(s);
      EXPECT_TRUE(seeds_a.insert(s).second) << "seeds repeat within a plan";
      EXPECT_GE(s, 1u);
      EXPECT_LT(s, uint64_t{1} << 31);
    }
  for (auto k : b.get().getCases())
    for (auto s : k.getOptions().getSeeds())
      list_b.push_back(s);
  for (auto k : c.get().getCases())
    for (auto s : k.getOptions().getSeeds())
      seeds_c.insert(s);
  EXPECT_EQ(list_a, list_b);
  EXPECT_EQ(names_of(a.get()), names_of(b.get()));
  for (auto s : seeds_a)
    EXPECT_FALSE(seeds_c.count(s)) << s;
  EXPECT_EQ(agents::case_seed(11, 0), list_a[0]);
}

TEST(ChooseTests, ASpecWithoutConfigurationsIsRefused) {
  capnp::MallocMessageBuilder request, plan;
  auto r = request.initRoot<schema::TesterRequest>();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  r.initSpec().setName("empty");
  std::string error;
  EXPECT_FALSE(agents::choose_tests(r.asReader(), plan.initRoot<schema::TestPlan>(), error));
  EXPECT_NE(error.find("TesterRequest.spec"), std::string::npos) << error;
}

// ------------------------------------------------------------------------------- judge

struct verdict_holder {
  capnp::MallocMessageBuilder request;
  capnp::MallocMessageBuilder verdict;
  bool ok = false;
  std::string error;
  schema::Verdict::Reader get() { return verdict.getRoot<schema::Verdict>().asReader(); }
};

void make_verdict(verdict_holder& h, const spec_desc& d, const std::vector<std::string>& names,
                  const std::vector<tests::result_desc>& results) {
  auto j = h.request.initRoot<schema::JudgeRequest>();
  tests::fill_judge_request(j, d, names, results);
  h.ok = agents::judge(j.asReader(), h.verdict.initRoot<schema::Verdict>(), h.error);
}

const spec_desc matmul = tests::matmul_desc(256, 256, 256, "float32", 2e-2);

TEST(Judge, AllPassedIsCorrectWithTheWorstRatio) {
  verdict_holder h;
  // 0.01 / (0.02 + 0.02 * 0.01 / 0.005) = 1/6; 0.002 / (0.02 + 0.02 * 0.002 / 0.1) = 0.0962
  make_verdict(h, matmul, {"fresh inputs", "zeros"},
               {tests::passed_result(0.01, 0.005), tests::passed_result(0.002, 0.1)});
  ASSERT_TRUE(h.ok) << h.error;
  auto v = h.get();
  EXPECT_TRUE(v.getCorrect());
  EXPECT_EQ(v.getFailedCase(), -1);
  EXPECT_NEAR(v.getWorstRatio(), 1.0 / 6.0, 1e-12);
  EXPECT_NE(std::string(v.getSummary()).find("correct: 2 of 2 cases passed"), std::string::npos)
      << v.getSummary().cStr();
  EXPECT_NE(std::string(v.getSummary()).find("0.167"), std::string::npos) << v.getSummary().cStr();
}

TEST(Judge, AnExactMatchHasRatioZeroAndAPassedCaseNeverExceedsOne) {
  verdict_holder exact;
  make_verdict(exact, matmul, {"fresh inputs"}, {tests::passed_result(0, 0)});
  EXPECT_EQ(exact.get().getWorstRatio(), 0.0);
  // maxima from two different elements bound the ratio loosely (50 here): a passed case is
  // known to be within its allowance, so the bound is capped at 1
  verdict_holder loose;
  make_verdict(loose, tests::matmul_desc(8, 8, 8, "float32", 1e-2), {"fresh inputs"},
               {tests::passed_result(1.0, 1.0)});
  EXPECT_TRUE(loose.get().getCorrect());
  EXPECT_EQ(loose.get().getWorstRatio(), 1.0);
}

TEST(Judge, AMismatchFailsItsCaseWithTheRatioAndTheMessage) {
  verdict_holder h;
  auto bad = tests::failed_result(schema::ErrorClass::MISMATCH,
                                  "configuration 0, seed 5 (large): output 0: 3 of 65536 elements "
                                  "beyond atol=0.02 rtol=0.02",
                                  {{true, 0, 0.01, 0.001}, {false, 0, 0.5, 0.25}});
  make_verdict(h, matmul, {"fresh inputs", "ragged last blocks", "large magnitudes"},
               {tests::passed_result(0.001, 0.001), tests::passed_result(0.001, 0.001), bad});
  ASSERT_TRUE(h.ok) << h.error;
  auto v = h.get();
  EXPECT_FALSE(v.getCorrect());
  EXPECT_EQ(v.getFailedCase(), 2);
  // 0.5 / (0.02 + 0.02 * 0.5 / 0.25) = 8.33
  EXPECT_NEAR(v.getWorstRatio(), 0.5 / 0.06, 1e-9);
  std::string s = v.getSummary();
  EXPECT_NE(s.find("case 2 (large magnitudes) failed: test mismatch: configuration 0, seed 5"),
            std::string::npos) << s;
}

TEST(Judge, NonFiniteOutputsAndLoadFailuresHaveNoBoundedRatio) {
  verdict_holder nan;
  make_verdict(nan, matmul, {"fresh inputs", "large magnitudes"},
               {tests::passed_result(0.001, 0.001),
                tests::failed_result(schema::ErrorClass::NON_FINITE, "output 0: 12 NaN",
                                     {{false, 0, 0.0, 0.0}})});
  EXPECT_FALSE(nan.get().getCorrect());
  EXPECT_EQ(nan.get().getFailedCase(), 1);
  EXPECT_TRUE(std::isinf(nan.get().getWorstRatio()));
  EXPECT_NE(std::string(nan.get().getSummary()).find("unbounded"), std::string::npos);

  auto load = tests::passed_result(0, 0);
  load.phases = {{schema::Phase::LOAD, schema::Status::FAILED, schema::ErrorClass::LOAD_ERROR,
                  "kernel.py:3: SyntaxError"},
                 {schema::Phase::TEST, schema::Status::SKIPPED, schema::ErrorClass::NONE,
                  "the kernel did not load or lower"}};
  load.correct = false;
  load.cases.clear();
  verdict_holder h;
  make_verdict(h, matmul, {"fresh inputs"}, {load});
  EXPECT_FALSE(h.get().getCorrect());
  EXPECT_EQ(h.get().getFailedCase(), 0);
  EXPECT_NE(std::string(h.get().getSummary()).find("load loadError: kernel.py:3"), std::string::npos)
      << h.get().getSummary().cStr();
}

TEST(Judge, ASkipWithAReasonDoesNotFail) {
  verdict_holder h;
  make_verdict(h, matmul, {"fresh inputs", "zeros"},
               {tests::passed_result(0.001, 0.001),
                tests::skipped_result("every case was skipped; the reference's output is not "
                                      "finite on zeros inputs")});
  ASSERT_TRUE(h.ok) << h.error;
  EXPECT_TRUE(h.get().getCorrect());
  EXPECT_EQ(h.get().getFailedCase(), -1);
  std::string s = h.get().getSummary();
  EXPECT_NE(s.find("correct: 1 of 2 cases passed; skipped: zeros (every case was skipped; the "
                   "reference's output is not finite"),
            std::string::npos) << s;
}

TEST(Judge, ASkipWithoutAReasonFailsAndAllSkippedIsNotCorrect) {
  verdict_holder silent;
  make_verdict(silent, matmul, {"fresh inputs", "zeros"},
               {tests::passed_result(0.001, 0.001), tests::skipped_result("")});
  EXPECT_FALSE(silent.get().getCorrect());
  EXPECT_EQ(silent.get().getFailedCase(), 1);

  verdict_holder none;
  make_verdict(none, matmul, {"zeros"}, {tests::skipped_result("not finite")});
  EXPECT_FALSE(none.get().getCorrect());
  EXPECT_EQ(none.get().getFailedCase(), -1);
  EXPECT_NE(std::string(none.get().getSummary()).find("every one was skipped"), std::string::npos);
}

TEST(Judge, AFailedProfileAloneDoesNotFailCorrectness) {
  // measured timing on a machine without a TPU fails the profile phase, not the test
  auto r = tests::passed_result(0.001, 0.001);
  std::get<1>(r.phases[2]) = schema::Status::FAILED;
  std::get<2>(r.phases[2]) = schema::ErrorClass::BAD_INPUT;
  verdict_holder h;
  make_verdict(h, matmul, {"fresh inputs"}, {r});
  EXPECT_TRUE(h.get().getCorrect());
  // but a test phase that passed on a result not marked correct does
  r.correct = false;
  verdict_holder odd;
  make_verdict(odd, matmul, {"fresh inputs"}, {r});
  EXPECT_FALSE(odd.get().getCorrect());
}

TEST(Judge, PerOutputTolerancesScaleTheRatio) {
  auto d = matmul;
  d.outputs.push_back({{"M", "N"}, "float32"});
  d.tolerances = {{-1, 1e-3, 0.0}, {1, 1e-1, 0.0}};
  auto on = [&](int output) {
    auto r = tests::passed_result(0.05, 0);
    r.cases[0].passed = false;
    r.cases[0].output = output;
    r.phases[3] = {schema::Phase::TEST, schema::Status::FAILED, schema::ErrorClass::MISMATCH, "x"};
    r.correct = false;
    verdict_holder h;
    make_verdict(h, d, {"fresh inputs"}, {r});
    return h.get().getWorstRatio();
  };
  EXPECT_NEAR(on(0), 50.0, 1e-9);   // 0.05 / 1e-3
  EXPECT_NEAR(on(1), 1.0, 1e-9);    // 0.05 / 0.1 = 0.5, but it failed: at least 1
}

TEST(Judge, ResultsMustAnswerThePlanOneToOne) {
  verdict_holder h;
  make_verdict(h, matmul, {"fresh inputs", "zeros"}, {tests::passed_result(0, 0)});
  EXPECT_FALSE(h.ok);
  EXPECT_NE(h.error.find("1 result for 2 plan cases"), std::string::npos) << h.error;
  verdict_holder empty;
  make_verdict(empty, matmul, {}, {});
  EXPECT_FALSE(empty.ok);
  EXPECT_NE(empty.error.find("no cases"), std::string::npos) << empty.error;
}

}  // namespace
