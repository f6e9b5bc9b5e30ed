#include "cli/workload_report.hpp"

#include <fmt/format.h>

#include <map>

namespace maxkernel::cli {

using json = nlohmann::json;

namespace {

double number_or(const json& row, const char* key, double fallback) {
  auto it = row.find(key);
  return it != row.end() && it->is_number() ? it->get<double>() : fallback;
}

}  // namespace

json workload_report(const config::workload_config& model, config::workload_phase phase,
                     const std::vector<config::workload_task>& tasks, const json& run) {
  std::map<std::string, const json*> rows;
  if (run.contains("tasks"))
    for (const auto& row : run["tasks"])
      rows[row.value("relative", row.value("task", ""))] = &row;
  bool prefill = phase == config::workload_phase::prefill;
  json out = {{"schema", 1},
              {"workload", model.name},
              {"source", model.source_path},
              {"phase", config::phase_name(phase)},
              {"tokens_per_step",
               prefill ? uint64_t{model.batch} * model.seq_len : uint64_t{model.decode_batch}},
              {"batch", prefill ? model.batch : model.decode_batch},
              {"seq_len", prefill ? model.seq_len : 1},
              {"kv_len", prefill ? 0 : model.kv_len},
              {"mode", run.value("mode", "")},
              {"chip", run.value("chip", "")},
              {"backend", run.value("backend", "")},
              {"timing", run.value("timing", "modeled")}};
  double before = 0, after = 0;
  uint64_t runs = 0;
  json rows_out = json::array(), untimed = json::array();
  for (const auto& t : tasks) {
    json r = {{"task", t.name},
              {"kind", t.kind},
              {"roles", t.roles},
              {"occurrences", t.occurrences},
              {"dims", json::object()}};
    for (const auto& [name, value] : t.dims)
      r["dims"][name] = value;
    runs += t.occurrences;
    auto it = rows.find(t.name);
    const json* row = it == rows.end() ? nullptr : it->second;
    bool correct = row && row->value("correct", false);
    bool fallback = !row || row->value("fallback_to_reference", true);
    double ref = row ? number_or(*row, "reference_time_us", -1) : -1;
    double kernel = row ? number_or(*row, "kernel_time_us", -1) : -1;
    double best = correct && !fallback && kernel > 0 && kernel < ref ? kernel : ref;
    r["correct"] = correct;
    r["fallback_to_reference"] = fallback;
    r["speedup_vs_reference"] = row ? number_or(*row, "speedup_vs_reference", 1.0) : 1.0;
    r["reference_time_us"] = ref >= 0 ? json(ref) : json(nullptr);
    r["best_time_us"] = ref >= 0 ? json(best) : json(nullptr);
    r["evaluations"] = row ? row->value("evaluations", 0) : 0;
    r["error"] = !row ? json("not run") : row->contains("error") ? (*row)["error"] : json(nullptr);
    if (ref >= 0) {
      r["step_time_before_us"] = t.occurrences * ref;
      r["step_time_after_us"] = t.occurrences * best;
      before += t.occurrences * ref;
      after += t.occurrences * best;
    } else {
      r["step_time_before_us"] = nullptr;
      r["step_time_after_us"] = nullptr;
      untimed.push_back(t.name);
    }
    rows_out.push_back(std::move(r));
  }
  for (auto& r : rows_out)
    r["share_of_step_before"] =
      r["step_time_before_us"].is_number() && before > 0
        ? json(r["step_time_before_us"].get<double>() / before)
        : json(nullptr);
  out["kernel_runs_per_step"] = runs;
  out["tasks"] = std::move(rows_out);
  out["untimed_tasks"] = std::move(untimed);
  out["step_time_before_us"] = before;
  out["step_time_after_us"] = after;
  out["step_speedup"] = after > 0 ? json(before / after) : json(nullptr);
  return out;
}

std::string workload_summary(const json& report) {
  std::string timing = report.value("timing", "modeled");
  std::string s = fmt::format(
    "{} {} on {} ({}, {}): {} tasks, {} kernel runs per step, {} tokens per step\n",
    report.value("workload", ""), report.value("phase", ""), report.value("chip", ""),
    report.value("mode", ""), timing, report["tasks"].size(),
    report.value("kernel_runs_per_step", 0), report.value("tokens_per_step", 0));
  s += fmt::format("  {:<34} {:>6} {:>14} {:>14} {:>8} {:>7}\n", "task", "x/step",
                   "reference us", "best us", "speedup", "share");
  auto us = [](const json& v) {
    return v.is_number() ? fmt::format("{:.1f}", v.get<double>()) : std::string("-");
  };
  for (const auto& t : report["tasks"]) {
    std::string note = !t["error"].is_null() ? "  failed: " + t["error"].get<std::string>()
                       : !t.value("correct", false)        ? "  no correct kernel"
                       : t.value("fallback_to_reference", false) ? "  (reference kept)"
                                                                 : "";
    s += fmt::format("  {:<34} {:>6} {:>14} {:>14} {:>7.2f}x {:>6}{}\n", t.value("task", ""),
                     t.value("occurrences", 0), us(t["reference_time_us"]),
                     us(t["best_time_us"]), t.value("speedup_vs_reference", 1.0),
                     t["share_of_step_before"].is_number()
                       ? fmt::format("{:.1f}%", 100 * t["share_of_step_before"].get<double>())
                       : std::string("-"),
                     note);
  }
  double before = report.value("step_time_before_us", 0.0);
  double after = report.value("step_time_after_us", 0.0);
  s += fmt::format("{} step time: {:.3f} ms before, {:.3f} ms after ({})", timing, before / 1e3,
                   after / 1e3,
                   report["step_speedup"].is_number()
                     ? fmt::format("{:.3f}x", report["step_speedup"].get<double>())
                     : std::string("no time"));
  if (!report["untimed_tasks"].empty())
    s += fmt::format("; without a time (left out): {}", report["untimed_tasks"].dump());
  return s + "\n";
}

}  // namespace maxkernel::cli
