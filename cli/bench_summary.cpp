#include "cli/bench_summary.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>

namespace maxkernel::cli {

using json = nlohmann::json;

namespace {

double number(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

bool flag(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// The speedup a task's result stands for: its kernel's, or 1.0 when the result is the
// reference (nothing correct, or nothing faster).
double speedup_of(const json& task) {
  double s = number(task, "speedup_vs_reference", 1.0);
  return flag(task, "correct") && s > 0 ? s : 1.0;
}

struct accumulator {
  unsigned tasks = 0, compiled = 0, correct = 0, fast_1 = 0, fast_1_5 = 0, fast_2 = 0;
  double log_sum = 0;
  unsigned baseline_tasks = 0, baseline_wins = 0;
  double baseline_log_sum = 0;
  unsigned roofline_tasks = 0;
  double roofline_sum = 0;
  uint64_t evaluations = 0, cache_hits = 0, prompt = 0, completion = 0;
  double wall = 0, worker = 0, device = 0, cost = 0;
  bool has_cost = false;
  json failures = json::object();

  void add(const json& t) {
    ++tasks;
    compiled += flag(t, "compiled") ? 1 : 0;
    bool ok = flag(t, "correct");
    correct += ok ? 1 : 0;
    double s = speedup_of(t);
    fast_1 += ok && s > 1.0 ? 1 : 0;
    fast_1_5 += ok && s > 1.5 ? 1 : 0;
    fast_2 += ok && s > 2.0 ? 1 : 0;
    log_sum += std::log(s);
    if (auto b = number(t, "speedup_vs_baseline", 0); b > 0) {
      ++baseline_tasks;
      baseline_log_sum += std::log(b);
      baseline_wins += b >= 1.0 - 1e-9 ? 1 : 0;
    }
    if (auto r = number(t, "roofline_fraction", -1); r >= 0) {
      ++roofline_tasks;
      roofline_sum += r;
    }
    evaluations += static_cast<uint64_t>(number(t, "evaluations"));
    cache_hits += static_cast<uint64_t>(number(t, "cache_hits"));
    wall += number(t, "wall_seconds");
    worker += number(t, "worker_seconds");
    device += number(t, "device_seconds");
    if (auto it = t.find("tokens"); it != t.end() && it->is_object()) {
      prompt += static_cast<uint64_t>(number(*it, "prompt"));
      completion += static_cast<uint64_t>(number(*it, "completion"));
    }
    if (auto it = t.find("cost_usd"); it != t.end() && it->is_number()) {
      has_cost = true;
      cost += it->get<double>();
    }
    if (auto it = t.find("failures"); it != t.end() && it->is_object())
      for (auto& [cls, n] : it->items())
        if (n.is_number())
          failures[cls] = failures.value(cls, 0) + n.get<int64_t>();
  }

  double share(unsigned n) const { return tasks ? static_cast<double>(n) / tasks : 0.0; }
  double geomean() const { return tasks ? std::exp(log_sum / tasks) : 1.0; }
};

}  // namespace

std::string kernel_family(const std::string& t) {
  if (t.empty())
    return "unmatched";
  static const std::map<std::string, std::string> families = {
    {"matmul", "matmul"},          {"shared_operand_matmul", "matmul"},
    {"matmul_backward", "matmul"}, {"einsum_core", "matmul"},
    {"swiglu_mlp", "matmul"},      {"flash_attention", "attention"},
    {"paged_attention", "attention"}, {"attention_backward", "attention"},
    {"ragged_paged_attention", "attention"}, {"rope_projection", "matmul"},
    {"grouped_matmul", "moe"},     {"moe_ffn", "moe"},
    {"rowwise", "rowwise"},        {"conv_gemm", "conv"},
    {"retention", "recurrence"},   {"chunked_recurrence", "recurrence"},
  };
  auto it = families.find(t);
  return it == families.end() ? t : it->second;
}

json summarize_run(json run, std::vector<json> tasks) {
  accumulator all;
  std::map<std::string, accumulator> by_family;
  for (const auto& t : tasks) {
    all.add(t);
    by_family[t.value("family", std::string("unmatched"))].add(t);
  }
  run["tasks"] = std::move(tasks);
  run["tasks_total"] = all.tasks;
  run["compile_rate"] = all.share(all.compiled);
  run["correct_rate"] = all.share(all.correct);
  run["fast_1"] = all.share(all.fast_1);
  run["fast_1_5"] = all.share(all.fast_1_5);
  run["fast_2"] = all.share(all.fast_2);
  run["geomean_speedup_vs_reference"] = all.geomean();
  run["geomean_speedup_vs_baseline"] =
    all.baseline_tasks ? json(std::exp(all.baseline_log_sum / all.baseline_tasks)) : json(nullptr);
  run["baseline_tasks"] = all.baseline_tasks;
  run["baseline_at_least_as_fast"] = all.baseline_wins;
  run["mean_roofline_fraction"] =
    all.roofline_tasks ? json(all.roofline_sum / all.roofline_tasks) : json(nullptr);
  run["evaluations"] = all.evaluations;
  run["cache_hits"] = all.cache_hits;
  run["failures"] = all.failures;
  run["worker_seconds"] = all.worker;
  run["device_seconds"] = all.device;
  run["tokens"] = {{"prompt", all.prompt}, {"completion", all.completion}};
  run["cost_usd"] = all.has_cost ? json(all.cost) : json(nullptr);
  if (!run.contains("wall_seconds"))
    run["wall_seconds"] = all.wall;
  json families = json::object();
  for (const auto& [name, a] : by_family)
    families[name] = {{"tasks", a.tasks},
                      {"correct_rate", a.share(a.correct)},
                      {"geomean_speedup_vs_reference", a.geomean()},
                      {"evaluations", a.evaluations},
                      {"worker_seconds", a.worker},
                      {"device_seconds", a.device},
                      {"wall_seconds", a.wall},
                      {"tokens", a.prompt + a.completion}};
  run["families"] = families;
  return run;
}

json compare_modes(const std::vector<json>& runs, double tolerance) {
  json rows = json::array();
  // family -> (mode, geomean, worker seconds), in the runs' order
  struct entry {
    std::string mode;
    double geomean, worker;
  };
  std::map<std::string, std::vector<entry>> table;
  std::vector<std::string> order{"all"};
  for (const auto& run : runs) {
    std::string mode = run.value("mode", std::string("?"));
    auto tokens = run.value("tokens", json::object());
    json all = {{"mode", mode},
                {"family", "all"},
                {"tasks", run.value("tasks_total", 0)},
                {"correct_rate", number(run, "correct_rate")},
                {"geomean_speedup_vs_reference", number(run, "geomean_speedup_vs_reference", 1)},
                {"evaluations", run.value("evaluations", 0)},
                {"worker_seconds", number(run, "worker_seconds")},
                {"device_seconds", number(run, "device_seconds")},
                {"wall_seconds", number(run, "wall_seconds")},
                {"tokens", static_cast<uint64_t>(number(tokens, "prompt") +
                                                 number(tokens, "completion"))}};
    rows.push_back(all);
    table["all"].push_back({mode, all["geomean_speedup_vs_reference"], all["worker_seconds"]});
    const json families = run.value("families", json::object());
    for (auto& [family, f] : families.items()) {
      json row = f;
      row["mode"] = mode;
      row["family"] = family;
      rows.push_back(row);
      if (!table.count(family))
        order.push_back(family);
      table[family].push_back(
        {mode, number(f, "geomean_speedup_vs_reference", 1), number(f, "worker_seconds")});
    }
  }
  // The rule, family by family: the best geomean wins unless a cheaper mode is within the
  // tolerance of it.
  std::string rule;
  for (const auto& family : order) {
    const auto& entries = table[family];
    if (entries.empty())
      continue;
    const entry* best = &entries.front();
    for (const auto& e : entries)
      if (e.geomean > best->geomean)
        best = &e;
    const entry* choice = best;
    unsigned close = 0;
    for (const auto& e : entries) {
      bool near = e.geomean >= best->geomean * (1 - tolerance);
      close += near ? 1 : 0;
      if (near && e.worker < choice->worker)
        choice = &e;
    }
    std::string why =
      choice == best
        ? (close > 1 ? fmt::format("geomean {:.3f}x, the highest, and the cheapest of the {} "
                                   "modes within {:.0f}% of it",
                                   best->geomean, close, tolerance * 100)
                     : fmt::format("geomean {:.3f}x, the highest", best->geomean))
        : fmt::format("geomean {:.3f}x, within {:.0f}% of {}'s {:.3f}x at {:.0f}% of its worker "
                      "seconds",
                      choice->geomean, tolerance * 100, best->mode, best->geomean,
                      best->worker > 0 ? 100 * choice->worker / best->worker : 0.0);
    rule += fmt::format("{}{}: {} ({})", rule.empty() ? "" : "; ", family, choice->mode, why);
  }
  return {{"rows", rows}, {"rule", rule}};
}

}  // namespace maxkernel::cli
