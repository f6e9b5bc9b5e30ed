// The bench's figures from rows: KernelBench's fast_p, geometric means in which a task without
// a correct kernel counts 1.0, baseline parity, families, and the mode-choice rule.
#include "cli/bench_summary.hpp"

#include <gtest/gtest.h>

#include <cmath>

using maxkernel::cli::compare_modes;
using maxkernel::cli::kernel_family;
using maxkernel::cli::summarize_run;
using json = nlohmann::json;

namespace {

json row(const std::string& family, bool correct, double speedup, json vs_baseline = nullptr,
         double worker = 1) {
  return {{"task", family + std::to_string(speedup)},
          {"family", family},
          {"correct", correct},
          {"compiled", correct},
          {"speedup_vs_reference", speedup},
          {"speedup_vs_baseline", vs_baseline},
          {"roofline_fraction", correct ? json(0.5) : json(nullptr)},
          {"evaluations", 10},
          {"cache_hits", 2},
          {"failures", {{"lowerBlockShape", 1}}},
          {"wall_seconds", 3.0},
          {"worker_seconds", worker},
          {"device_seconds", 0.5},
          {"tokens", {{"prompt", 0}, {"completion", 0}}},
          {"cost_usd", nullptr}};
}

}  // namespace

TEST(bench_summary, rates_are_shares_of_every_task_and_fast_p_is_strict) {
  // 1.0x correct is not fast_1; 1.5x is fast_1 but not fast_1.5; a failed task stays a row.
  auto run = summarize_run({{"mode", "graph"}},
                           {row("matmul", true, 1.0), row("matmul", true, 1.5),
                            row("attention", true, 3.0), row("unmatched", false, 1.0)});
  EXPECT_EQ(run["tasks_total"], 4);
  EXPECT_DOUBLE_EQ(run["correct_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(run["compile_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(run["fast_1"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(run["fast_1_5"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(run["fast_2"].get<double>(), 0.25);
  EXPECT_NEAR(run["geomean_speedup_vs_reference"].get<double>(), std::pow(1.0 * 1.5 * 3.0, 0.25),
              1e-12);
  EXPECT_EQ(run["evaluations"], 40);
  EXPECT_EQ(run["cache_hits"], 8);
  EXPECT_EQ(run["failures"]["lowerBlockShape"], 4);
  EXPECT_DOUBLE_EQ(run["mean_roofline_fraction"].get<double>(), 0.5);
  EXPECT_TRUE(run["geomean_speedup_vs_baseline"].is_null());
  EXPECT_TRUE(run["cost_usd"].is_null());
  ASSERT_EQ(run["tasks"].size(), 4u);
}

TEST(bench_summary, a_task_without_a_correct_kernel_counts_as_the_reference) {
  // Whatever speedup an incorrect row carries, the result it stands for is the reference.
  auto run = summarize_run({}, {row("matmul", false, 5.0), row("matmul", true, 4.0)});
  EXPECT_NEAR(run["geomean_speedup_vs_reference"].get<double>(), 2.0, 1e-12);
  EXPECT_DOUBLE_EQ(run["fast_2"].get<double>(), 0.5);
}

TEST(bench_summary, baseline_parity_counts_tasks_at_least_as_fast) {
  auto run = summarize_run({}, {row("attention", true, 2.0, 1.0), row("attention", true, 2.0, 0.8),
                                row("matmul", true, 2.0, 1.25), row("matmul", true, 2.0)});
  EXPECT_EQ(run["baseline_tasks"], 3);
  EXPECT_EQ(run["baseline_at_least_as_fast"], 2);
  EXPECT_NEAR(run["geomean_speedup_vs_baseline"].get<double>(), std::cbrt(1.0 * 0.8 * 1.25), 1e-12);
}

TEST(bench_summary, families_aggregate_their_own_tasks) {
  auto run = summarize_run({}, {row("attention", true, 4.0), row("attention", false, 1.0),
                                row("rowwise", true, 2.0)});
  auto f = run["families"];
  ASSERT_TRUE(f.contains("attention"));
  EXPECT_EQ(f["attention"]["tasks"], 2);
  EXPECT_DOUBLE_EQ(f["attention"]["correct_rate"].get<double>(), 0.5);
  EXPECT_NEAR(f["attention"]["geomean_speedup_vs_reference"].get<double>(), 2.0, 1e-12);
  EXPECT_NEAR(f["rowwise"]["geomean_speedup_vs_reference"].get<double>(), 2.0, 1e-12);
}

TEST(bench_summary, an_empty_run_has_neutral_figures) {
  auto run = summarize_run({}, {});
  EXPECT_EQ(run["tasks_total"], 0);
  EXPECT_DOUBLE_EQ(run["correct_rate"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(run["geomean_speedup_vs_reference"].get<double>(), 1.0);
}

TEST(bench_summary, families_come_from_the_template_not_the_task) {
  EXPECT_EQ(kernel_family("flash_attention"), "attention");
  EXPECT_EQ(kernel_family("paged_attention"), "attention");
  EXPECT_EQ(kernel_family("shared_operand_matmul"), "matmul");
  EXPECT_EQ(kernel_family("moe_ffn"), "moe");
  EXPECT_EQ(kernel_family(""), "unmatched");
  EXPECT_EQ(kernel_family("some_new_template"), "some_new_template");
}

TEST(bench_summary, the_rule_takes_the_best_mode_unless_a_cheaper_one_is_close) {
  // matmul: graph is 10% better -> graph. rowwise: graph 1% better at 3x the cost -> auto.
  auto auto_run = summarize_run({{"mode", "auto"}},
                                {row("matmul", true, 1.0, nullptr, 1), row("rowwise", true, 2.0, nullptr, 1)});
  auto graph_run = summarize_run({{"mode", "graph"}},
                                 {row("matmul", true, 1.1, nullptr, 3), row("rowwise", true, 2.02, nullptr, 3)});
  auto c = compare_modes({auto_run, graph_run});
  std::string rule = c["rule"];
  EXPECT_NE(rule.find("matmul: graph"), std::string::npos) << rule;
  EXPECT_NE(rule.find("rowwise: auto"), std::string::npos) << rule;
  EXPECT_EQ(rule.rfind("all: ", 0), 0u) << rule;
  EXPECT_NE(rule.find("rowwise: auto (geomean 2.000x, within 2% of graph's 2.020x at 33% of its "
                      "worker seconds)"),
            std::string::npos)
    << rule;
  // One "all" row per mode and one per family and mode.
  EXPECT_EQ(c["rows"].size(), 6u);
  EXPECT_EQ(c["rows"][0]["family"], "all");
  EXPECT_EQ(c["rows"][0]["mode"], "auto");
}

TEST(bench_summary, a_tie_goes_to_the_cheapest_mode_and_says_so) {
  auto a = summarize_run({{"mode", "auto"}}, {row("rowwise", true, 2.0, nullptr, 1)});
  auto g = summarize_run({{"mode", "graph"}}, {row("rowwise", true, 2.0, nullptr, 2)});
  std::string rule = compare_modes({g, a})["rule"];
  EXPECT_NE(rule.find("all: auto (geomean 2.000x, within 2% of graph's 2.000x at 50%"),
            std::string::npos)
    << rule;
  rule = compare_modes({a, g})["rule"];
  EXPECT_NE(rule.find("all: auto (geomean 2.000x, the highest, and the cheapest of the 2 modes"),
            std::string::npos)
    << rule;
}
