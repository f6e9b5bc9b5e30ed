// The workload report: step times weighted by occurrence, the best correct kernel where it
// beats the reference and the reference elsewhere, untimed tasks left out and named.
#include "cli/workload_report.hpp"

#include <gtest/gtest.h>

namespace maxkernel::cli::test {
namespace {

using json = nlohmann::json;

config::workload_task task(const std::string& name, uint64_t occurrences) {
  config::workload_task t;
  t.name = name;
  t.kind = "matmul";
  t.roles = {name};
  t.occurrences = occurrences;
  t.dims = {{"M", 8}};
  return t;
}

json row(const std::string& name, bool correct, bool fallback, json ref, json kernel,
         double speedup) {
  return {{"relative", name},           {"correct", correct},
          {"fallback_to_reference", fallback}, {"reference_time_us", ref},
          {"kernel_time_us", kernel},   {"speedup_vs_reference", speedup},
          {"evaluations", 3},           {"error", nullptr}};
}

TEST(WorkloadReport, StepTimesAreWeightedByOccurrence) {
  config::workload_config m;
  m.name = "tiny";
  m.batch = 2;
  m.seq_len = 8;
  m.decode_batch = 4;
  m.kv_len = 16;
  std::vector<config::workload_task> tasks{task("a", 3), task("b", 2), task("c", 1), task("d", 5)};
  json run = {{"mode", "graph"}, {"chip", "v6e"}, {"timing", "modeled"},
              {"tasks",
               {row("a", true, false, 10.0, 5.0, 2.0),        // faster kernel
                row("b", true, true, 4.0, 4.0, 1.0),          // the reference kept
                row("c", false, true, 7.0, nullptr, 1.0),     // no correct kernel
                row("d", false, true, nullptr, nullptr, 1.0)}}};  // failed: no time
  auto r = workload_report(m, config::workload_phase::decode, tasks, run);
  EXPECT_EQ(r["timing"], "modeled");
  EXPECT_EQ(r["tokens_per_step"], 4);
  EXPECT_EQ(r["kernel_runs_per_step"], 11);
  EXPECT_DOUBLE_EQ(r["step_time_before_us"].get<double>(), 3 * 10.0 + 2 * 4.0 + 7.0);
  EXPECT_DOUBLE_EQ(r["step_time_after_us"].get<double>(), 3 * 5.0 + 2 * 4.0 + 7.0);
  EXPECT_DOUBLE_EQ(r["step_speedup"].get<double>(), 45.0 / 30.0);
  EXPECT_EQ(r["untimed_tasks"], json::array({"d"}));
  EXPECT_DOUBLE_EQ(r["tasks"][0]["share_of_step_before"].get<double>(), 30.0 / 45.0);
  EXPECT_DOUBLE_EQ(r["tasks"][2]["best_time_us"].get<double>(), 7.0);
  EXPECT_TRUE(r["tasks"][3]["step_time_before_us"].is_null());
  auto text = workload_summary(r);
  EXPECT_NE(text.find("modeled step time: 0.045 ms before, 0.030 ms after (1.500x)"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("without a time"), std::string::npos);
}

TEST(WorkloadReport, ATaskMissingFromTheRunIsUntimed) {
  config::workload_config m;
  m.name = "tiny";
  m.batch = 2;
  m.seq_len = 8;
  auto r = workload_report(m, config::workload_phase::prefill, {task("a", 2)},
                           json{{"timing", "measured"}, {"tasks", json::array()}});
  EXPECT_EQ(r["timing"], "measured");
  EXPECT_EQ(r["tokens_per_step"], 16);
  EXPECT_EQ(r["tasks"][0]["error"], "not run");
  EXPECT_DOUBLE_EQ(r["step_time_before_us"].get<double>(), 0.0);
  EXPECT_TRUE(r["step_speedup"].is_null());
}

}  // namespace
}  // namespace maxkernel::cli::test
