// `maxkernel bench --html`: the page built from bench JSONs written here (one run with a failed
// task, no baselines and null speedups; two modes with a comparison; an empty run; inputs of
// the wrong shape). The page must name every task escaped, show errors and figures, carry no
// script, and nest its tags properly; it must never throw.
#include "cli/bench_report.hpp"
#include "cli/svg_chart.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>
#include <vector>

using maxkernel::cli::bench_report_html;
using nlohmann::json;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

size_t occurrences(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1))
    ++n;
  return n;
}

// Every end tag closes the innermost open element, and all are closed at the end (void HTML
// elements and self-closing SVG elements excepted); "" when so, else what went wrong.
std::string nesting_error(const std::string& page) {
  std::vector<std::string> open;
  for (size_t at = page.find('<'); at != std::string::npos; at = page.find('<', at + 1)) {
    if (page.compare(at, 2, "<!") == 0)
      continue;  // the doctype
    size_t end = page.find('>', at);
    if (end == std::string::npos)
      return fmt::format("unterminated tag at {}", at);
    std::string tag = page.substr(at + 1, end - at - 1);
    bool closing = !tag.empty() && tag[0] == '/';
    bool self_closing = !tag.empty() && tag.back() == '/';
    std::string name = tag.substr(closing ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \n/"));
    if (name.empty())
      return fmt::format("empty tag at {}", at);
    if (self_closing || name == "meta" || name == "br")
      continue;
    if (!closing) {
      open.push_back(name);
    } else if (open.empty() || open.back() != name) {
      return fmt::format("</{}> at {} closes <{}>", name, at, open.empty() ? "" : open.back());
    } else {
      open.pop_back();
    }
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

void expect_sound(const std::string& page) {
  EXPECT_TRUE(contains(page, "<html")) << page.substr(0, 200);
  EXPECT_FALSE(contains(page, "<script"));
  EXPECT_FALSE(contains(page, "src="));  // no external resource
  EXPECT_FALSE(contains(page, "href=\"http"));
  EXPECT_EQ(occurrences(page, "<svg"), occurrences(page, "</svg>"));
  EXPECT_EQ(nesting_error(page), "");
}

json correct_task(const std::string& name, double speedup, json curve) {
  return {{"schema", 1},
          {"task", name},
          {"path", "bench/specs/" + name + ".yaml"},
          {"mode", "graph"},
          {"chip", "v6e"},
          {"timing", "modeled"},
          {"family", "matmul"},
          {"correct", true},
          {"compiled", true},
          {"fallback_to_reference", false},
          {"kernel_time_us", 100.0},
          {"reference_time_us", 100.0 * speedup},
          {"baseline_time_us", nullptr},
          {"speedup_vs_reference", speedup},
          {"speedup_vs_baseline", nullptr},
          {"roofline_time_us", 50.0},
          {"roofline_fraction", 0.5},
          {"evaluations", 12},
          {"cache_hits", 2},
          {"failures", {{"incorrect", 2}}},
          {"wall_seconds", 3.5},
          {"tokens", {{"prompt", 0}, {"completion", 0}}},
          {"cost_usd", nullptr},
          {"candidates_evaluated", 3},
          {"stop_reason", "budget"},
          {"best_candidate", {{"template", "tiled_matmul"}, {"strategy", "tile"},
                              {"params", {{"bm", 256}}}}},
          {"best_speedup_per_candidate", std::move(curve)},
          {"error", nullptr},
          {"exit_code", 0},
          {"profile",
           {{"timing", "modeled"},
            {"time_us", 100.0},
            {"roofline_us", 50.0},
            {"outside_us", 10.0},
            {"bound", "memory"},
            {"mxu_utilization", 0.4},
            {"calls",
             {{{"name", "kernel"}, {"compute_us", 60.0}, {"exposed_dma_us", 25.0},
               {"overhead_us", 5.0}}}}}}};
}

json failed_task(const std::string& name, const std::string& error) {
  return {{"schema", 1},          {"task", name},
          {"path", name},         {"mode", "graph"},
          {"chip", "v6e"},        {"family", "unmatched"},
          {"correct", false},     {"compiled", false},
          {"fallback_to_reference", true}, {"speedup_vs_reference", 1.0},
          {"error", error},       {"exit_code", 2},
          {"evaluations", 0},     {"failures", json::object()},
          {"wall_seconds", 0.1},  {"best_speedup_per_candidate", json::array()}};
}

// One graph run: a correct task named to need escaping, a task whose search found nothing
// correct (null speedups), and a task that failed to load; no baselines anywhere.
json one_run() {
  json nothing = correct_task("softmax_rows", 1.0, {nullptr, nullptr});
  nothing["correct"] = false;
  nothing["fallback_to_reference"] = true;
  nothing["speedup_vs_reference"] = nullptr;
  nothing["roofline_fraction"] = nullptr;
  nothing["profile"] = nullptr;
  nothing["best_candidate"] = nullptr;
  nothing["failures"] = {{"compile", 3}};
  return {{"schema", 1},
          {"suite", "bench/specs"},
          {"mode", "graph"},
          {"chip", "v6e"},
          {"timing", "modeled"},
          {"budget_evals", 16},
          {"tasks",
           {correct_task("<b>&", 2.0, {nullptr, 1.5, 2.0}), nothing,
            failed_task("broken_task", "spec.yaml:3: field 'shape': expected a list <got 3>")}},
          {"tasks_total", 3},
          {"compile_rate", 0.3333},
          {"correct_rate", 0.3333},
          {"fast_1", 0.3333},
          {"fast_1_5", 0.3333},
          {"fast_2", 0.0},
          {"geomean_speedup_vs_reference", 1.2599},
          {"geomean_speedup_vs_baseline", nullptr},
          {"baseline_tasks", 0},
          {"baseline_at_least_as_fast", 0},
          {"mean_roofline_fraction", nullptr},
          {"evaluations", 24},
          {"cache_hits", 2},
          {"failures", {{"compile", 3}, {"incorrect", 2}}},
          {"wall_seconds", 7.1},
          {"worker_seconds", 5.0},
          {"device_seconds", 0.002},
          {"tokens", {{"prompt", 0}, {"completion", 0}}},
          {"cost_usd", nullptr}};
}

TEST(BenchReport, OneRunNamesEveryTaskEscapedAndShowsTheFailure) {
  std::string page;
  ASSERT_NO_THROW(page = bench_report_html(one_run()));
  expect_sound(page);
  EXPECT_TRUE(contains(page, "&lt;b&gt;&amp;"));
  EXPECT_FALSE(contains(page, "<b>&"));
  EXPECT_TRUE(contains(page, "softmax_rows"));
  EXPECT_TRUE(contains(page, "broken_task"));
  // The load error in full (escaped) in the task table, its first line by its bar.
  EXPECT_TRUE(contains(page, "spec.yaml:3: field &#39;shape&#39;: expected a list &lt;got 3&gt;"));
  EXPECT_TRUE(contains(page, "failed: spec.yaml:3"));
  EXPECT_TRUE(contains(page, "no correct kernel"));
  EXPECT_TRUE(contains(page, "1.26x"));  // the run's geomean against the reference
  EXPECT_TRUE(contains(page, "no baselines"));
  EXPECT_TRUE(contains(page, "modeled"));
  EXPECT_FALSE(contains(page, "measured"));
  EXPECT_TRUE(contains(page, "<td>compile</td><td>3</td>"));
  EXPECT_TRUE(contains(page, "<td>incorrect</td><td>2</td>"));
}

TEST(BenchReport, CurveIsTheGeomeanOfBestSoFarWithUncorrectTasksAtOne) {
  std::string page = bench_report_html(one_run());
  // After 3 candidates: "<b>&" best 2.0, the other two 1.0: geomean cbrt(2) = 1.26x; after 2:
  // cbrt(1.5) = 1.14x; after 1: nothing correct yet, 1.00x.
  EXPECT_TRUE(contains(page, "graph (modeled): 1.26x after 3")) << page;
  EXPECT_TRUE(contains(page, "<td>1.00x</td><td>1.14x</td><td>1.26x</td>"));
}

TEST(BenchReport, TwoModesShowEachGeomeanTheComparisonAndTheRule) {
  json graph = one_run();
  json autorun = one_run();
  autorun["mode"] = "auto";
  autorun["geomean_speedup_vs_reference"] = 1.0873;
  autorun["failures"] = {{"timeout", 4}};
  for (auto& t : autorun["tasks"])
    t["mode"] = "auto";
  json bench = {{"schema", 1},
                {"suite", "bench/specs"},
                {"chip", "v6e"},
                {"budget_evals", 16},
                {"modes", {graph, autorun}},
                {"comparison",
                 {{"rows",
                   {{{"mode", "graph"}, {"family", "all"}, {"tasks", 3},
                     {"correct_rate", 0.3333}, {"geomean_speedup_vs_reference", 1.2599},
                     {"evaluations", 24}, {"worker_seconds", 5.0}, {"device_seconds", 0.002},
                     {"wall_seconds", 7.1}, {"tokens", 0}},
                    {{"mode", "auto"}, {"family", "matmul"}, {"tasks", 1},
                     {"correct_rate", 1.0}, {"geomean_speedup_vs_reference", 1.0873},
                     {"evaluations", 12}, {"worker_seconds", 2.0}, {"device_seconds", 0.001},
                     {"wall_seconds", 3.0}, {"tokens", 0}}}},
                  {"rule", "choose graph when its geomean is >= auto's & cost < 2x"}}}};
  std::string page;
  ASSERT_NO_THROW(page = bench_report_html(bench));
  expect_sound(page);
  EXPECT_TRUE(contains(page, "1.26x"));
  EXPECT_TRUE(contains(page, "1.09x"));
  EXPECT_TRUE(contains(page, "<th>graph<br><small>modeled</small></th>"));
  EXPECT_TRUE(contains(page, "<th>auto<br><small>modeled</small></th>"));
  EXPECT_TRUE(
    contains(page, "choose graph when its geomean is &gt;= auto&#39;s &amp; cost &lt; 2x"));
  EXPECT_TRUE(contains(page, "<td>auto</td><td>matmul</td><td>1</td><td>100%</td>"));
  // Per-task bars grouped by task, one bar per mode, and both curves in the legend.
  EXPECT_TRUE(contains(page, "graph vs reference 2.00x (modeled)"));
  EXPECT_TRUE(contains(page, "auto vs reference 2.00x (modeled)"));
  EXPECT_TRUE(contains(page, "auto failed: spec.yaml:3"));
  EXPECT_TRUE(contains(page, "auto (modeled): 1.26x after 3"));
  // Failures per class per mode: timeout only in auto.
  EXPECT_TRUE(contains(page, "<td>timeout</td><td>0</td><td>4</td>"));
}

TEST(BenchReport, BaselinesGetTheirOwnBars) {
  json run = one_run();
  run["tasks"][0]["baseline_time_us"] = 150.0;
  run["tasks"][0]["speedup_vs_baseline"] = 1.5;
  run["baseline_tasks"] = 1;
  run["baseline_at_least_as_fast"] = 1;
  run["geomean_speedup_vs_baseline"] = 1.5;
  std::string page = bench_report_html(run);
  expect_sound(page);
  EXPECT_TRUE(contains(page, "vs baseline 1.50x (modeled)"));
  EXPECT_TRUE(contains(page, "<td>1/1</td>"));
}

TEST(BenchReport, MeasuredTimesAreLabelledMeasured) {
  json run = one_run();
  run["timing"] = "measured";
  for (auto& t : run["tasks"])
    if (t.contains("timing"))
      t["timing"] = "measured";
  run["tasks"][0]["profile"]["timing"] = "measured";
  std::string page = bench_report_html(run);
  expect_sound(page);
  EXPECT_TRUE(contains(page, "kernel us (measured)"));
  EXPECT_FALSE(contains(page, "modeled"));
}

TEST(BenchReport, AnEmptyRunSaysThereAreNoTasks) {
  json run = {{"schema", 1}, {"mode", "graph"}, {"timing", "modeled"}, {"tasks", json::array()},
              {"tasks_total", 0}, {"geomean_speedup_vs_reference", nullptr}};
  std::string page;
  ASSERT_NO_THROW(page = bench_report_html(run));
  expect_sound(page);
  EXPECT_TRUE(contains(page, "No tasks"));
}

TEST(BenchReport, InputsOfTheWrongShapeYieldAPageNotAnException) {
  json partial = one_run();
  partial["tasks"].push_back(42);                       // not an object
  partial["tasks"].push_back({{"task", "bare"}});        // nothing but a name
  partial["tasks"][0]["profile"] = {{"calls", "none"}};  // wrong types
  partial["tasks"][0]["best_speedup_per_candidate"] = {"x", -1, nullptr, 3.0};
  partial["failures"] = "many";
  partial["tokens"] = nullptr;
  partial["geomean_speedup_vs_reference"] = "fast";
  for (const json& bench : {json(), json::array(), json("text"), json::object(), partial,
                            json{{"modes", json::array()}}, json{{"modes", {1, 2}}}}) {
    std::string page;
    ASSERT_NO_THROW(page = bench_report_html(bench)) << bench.dump();
    expect_sound(page);
  }
  std::string page = bench_report_html(partial);
  EXPECT_TRUE(contains(page, "bare"));
  EXPECT_TRUE(contains(page, "n/a"));
}

TEST(SvgChart, ShortenCutsWholeCharacters) {
  using maxkernel::cli::shorten;
  EXPECT_EQ(shorten("abcdef", 10), "abcdef");
  EXPECT_EQ(shorten("abcdefghijkl", 8), "abcde...");
  // Multi-byte characters (each "é" is 2 bytes) are never cut in half.
  EXPECT_EQ(shorten("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 4), "\xc3\xa9...");
}

}  // namespace
