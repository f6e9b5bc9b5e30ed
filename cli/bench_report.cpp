#include "cli/bench_report.hpp"

#include "cli/svg_chart.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace maxkernel::cli {

namespace {

using json = nlohmann::json;
using opt = std::optional<double>;

// Reading the JSON defensively: any field may be missing, null or of another type.
const json& at(const json& j, const char* key) {
  static const json none;
  if (!j.is_object())
    return none;
  auto it = j.find(key);
  return it == j.end() ? none : *it;
}
opt number(const json& j) {
  if (j.is_number()) {
    double v = j.get<double>();
    if (std::isfinite(v))
      return v;
  }
  return std::nullopt;
}
opt number(const json& j, const char* key) { return number(at(j, key)); }
std::string text(const json& j) {
  if (j.is_string())
    return j.get<std::string>();
  if (j.is_number() || j.is_boolean())
    return j.dump();
  return "";
}
std::string text(const json& j, const char* key) { return text(at(j, key)); }
bool flag(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_boolean() && v.get<bool>();
}
std::string compact(const json& j) {  // never throws, even on invalid UTF-8
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Formatting (plain text; escaped where it goes into the page).
const std::string na = "n/a";
std::string fixed(opt v, int digits = 2) {
  return v ? fmt::format("{:.{}f}", *v, digits) : na;
}
std::string times(opt v) { return v ? fmt::format("{:.2f}x", *v) : na; }
std::string percent(opt v) { return v ? fmt::format("{:.0f}%", 100 * *v) : na; }
std::string count(opt v) { return v ? fmt::format("{:.0f}", *v) : na; }
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

const std::vector<std::string> colours = {"#1565c0", "#e65100", "#2e7d32",
                                          "#6a1b9a", "#00838f", "#ad1457"};
const std::vector<std::string> light_colours = {"#90caf9", "#ffcc80", "#a5d6a7",
                                                "#ce93d8", "#80deea", "#f48fb1"};

struct run_info {
  const json* run = nullptr;
  std::string mode, timing, colour, light;
  std::vector<const json*> tasks;  // the task objects, suite order
};

std::string task_name(const json& task, size_t index) {
  std::string name = text(task, "task");
  if (name.empty())
    name = text(task, "path");
  return name.empty() ? fmt::format("task #{}", index + 1) : name;
}
// The same task across modes: its path when known, else its name.
std::string task_key(const json& task, size_t index) {
  std::string path = text(task, "path");
  return path.empty() ? task_name(task, index) : path;
}
std::string task_timing(const json& task, const run_info& r) {
  std::string t = text(task, "timing");
  return t.empty() ? r.timing : t;
}
std::string task_error(const json& task) {
  std::string e = text(task, "error");
  if (e.empty()) {
    opt code = number(task, "exit_code");
    if (code && *code >= 2)
      e = fmt::format("exit code {:.0f}", *code);
  }
  return e;
}
bool task_failed(const json& task) { return !task_error(task).empty(); }
std::string task_status(const json& task) {
  if (task_failed(task))
    return "failed";
  return flag(task, "correct") ? "correct" : "no correct kernel";
}

std::vector<run_info> runs_of(const json& bench) {
  std::vector<const json*> found;
  const json& modes = at(bench, "modes");
  if (modes.is_array()) {
    for (const auto& r : modes)
      if (r.is_object())
        found.push_back(&r);
  } else if (bench.is_object()) {
    found.push_back(&bench);
  }
  std::vector<run_info> runs;
  for (size_t i = 0; i < found.size(); ++i) {
    run_info r;
    r.run = found[i];
    r.mode = text(*r.run, "mode");
    if (r.mode.empty())
      r.mode = fmt::format("run {}", i + 1);
    r.colour = colours[i % colours.size()];
    r.light = light_colours[i % light_colours.size()];
    const json& tasks = at(*r.run, "tasks");
    if (tasks.is_array())
      for (const auto& t : tasks)
        if (t.is_object())
          r.tasks.push_back(&t);
    r.timing = text(*r.run, "timing");
    if (r.timing.empty()) {  // from the tasks when the run does not say
      std::set<std::string> seen;
      for (const auto* t : r.tasks)
        if (!text(*t, "timing").empty())
          seen.insert(text(*t, "timing"));
      r.timing = seen.size() == 1 ? *seen.begin() : seen.empty() ? "timing not stated" : "mixed";
    }
    runs.push_back(std::move(r));
  }
  return runs;
}

// A figure of the bench: the top level's, else the first run's.
std::string bench_text(const json& bench, const std::vector<run_info>& runs, const char* key) {
  std::string t = text(bench, key);
  return t.empty() && !runs.empty() ? text(*runs[0].run, key) : t;
}

std::string th(const std::string& s) { return "<th>" + html_escape(s) + "</th>"; }
std::string td(const std::string& s) { return "<td>" + html_escape(s) + "</td>"; }

// --- summary ---------------------------------------------------------------------------

std::string headline(const run_info& r) {
  const json& run = *r.run;
  size_t correct = 0;
  for (const auto* t : r.tasks)
    correct += flag(*t, "correct") ? 1 : 0;
  opt total = number(run, "tasks_total");
  std::string line = fmt::format(
    "{}: {} of {} tasks correct, geomean speedup {} against the reference ({})", r.mode,
    correct, total ? count(total) : std::to_string(r.tasks.size()),
    times(number(run, "geomean_speedup_vs_reference")), r.timing);
  opt base = number(run, "baseline_tasks");
  if (base && *base > 0)
    line += fmt::format(", {} against the baseline, at least as fast as the baseline on {}/{}",
                        times(number(run, "geomean_speedup_vs_baseline")),
                        count(number(run, "baseline_at_least_as_fast")), count(base));
  return "<li>" + html_escape(line + ".") + "</li>\n";
}

std::string summary_table(const std::vector<run_info>& runs) {
  using cell = std::string (*)(const run_info&);
  struct row {
    const char* label;
    cell value;
  };
  static const row rows[] = {
    {"tasks",
     [](const run_info& r) {
       opt n = number(*r.run, "tasks_total");
       return n ? count(n) : std::to_string(r.tasks.size());
     }},
    {"tasks failed (error)",
     [](const run_info& r) {
       return std::to_string(std::count_if(r.tasks.begin(), r.tasks.end(),
                                           [](const json* t) { return task_failed(*t); }));
     }},
    {"tasks without a correct kernel",
     [](const run_info& r) {
       return std::to_string(std::count_if(r.tasks.begin(), r.tasks.end(),
                                           [](const json* t) { return !flag(*t, "correct"); }));
     }},
    {"compile %", [](const run_info& r) { return percent(number(*r.run, "compile_rate")); }},
    {"correct %", [](const run_info& r) { return percent(number(*r.run, "correct_rate")); }},
    {"fast_1 (correct, > 1.0x)",
     [](const run_info& r) { return percent(number(*r.run, "fast_1")); }},
    {"fast_1.5 (correct, > 1.5x)",
     [](const run_info& r) { return percent(number(*r.run, "fast_1_5")); }},
    {"fast_2 (correct, > 2.0x)",
     [](const run_info& r) { return percent(number(*r.run, "fast_2")); }},
    {"geomean speedup vs reference",
     [](const run_info& r) { return times(number(*r.run, "geomean_speedup_vs_reference")); }},
    {"geomean speedup vs baseline",
     [](const run_info& r) {
       opt g = number(*r.run, "geomean_speedup_vs_baseline");
       return g ? times(g) : std::string("n/a (no baselines)");
     }},
    {"baseline parity (at least as fast / with a baseline)",
     [](const run_info& r) {
       opt n = number(*r.run, "baseline_tasks");
       if (!n || *n <= 0)
         return std::string("no baselines");
       return fmt::format("{}/{}", count(number(*r.run, "baseline_at_least_as_fast")), count(n));
     }},
    {"mean roofline fraction",
     [](const run_info& r) { return percent(number(*r.run, "mean_roofline_fraction")); }},
    {"evaluations", [](const run_info& r) { return count(number(*r.run, "evaluations")); }},
    {"cache hits", [](const run_info& r) { return count(number(*r.run, "cache_hits")); }},
    {"wall seconds", [](const run_info& r) { return fixed(number(*r.run, "wall_seconds"), 1); }},
    {"worker CPU seconds",
     [](const run_info& r) { return fixed(number(*r.run, "worker_seconds"), 1); }},
    {"device seconds",
     [](const run_info& r) {
       opt s = number(*r.run, "device_seconds");
       return s ? fmt::format("{:.3f} ({})", *s, r.timing) : na;
     }},
    {"tokens (prompt + completion)",
     [](const run_info& r) {
       const json& t = at(*r.run, "tokens");
       return fmt::format("{} + {}", count(number(t, "prompt")), count(number(t, "completion")));
     }},
    {"cost USD",
     [](const run_info& r) {
       opt c = number(*r.run, "cost_usd");
       return c ? fmt::format("{:.4f}", *c) : std::string("n/a (unknown)");
     }},
  };
  std::string out = "<table>\n<tr><th></th>";
  for (const auto& r : runs)
    out += fmt::format("<th>{}<br><small>{}</small></th>", html_escape(r.mode),
                       html_escape(r.timing));
  out += "</tr>\n";
  for (const auto& row : rows) {
    out += "<tr>" + th(row.label);
    for (const auto& r : runs)
      out += td(row.value(r));
    out += "</tr>\n";
  }
  return out + "</table>\n<p><small>Speedups and device seconds carry each mode's timing "
               "(under its name); a failed task counts 1.0x in the geomean against the "
               "reference.</small></p>\n";
}

// --- speedup bars ------------------------------------------------------------------------

// The tasks of all runs, matched across runs: key order of first appearance.
struct task_row {
  std::string name;
  std::vector<const json*> per_run;  // nullptr when the run does not have the task
};
std::vector<task_row> task_rows(const std::vector<run_info>& runs) {
  std::vector<task_row> rows;
  std::map<std::string, size_t> index;
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t i = 0; i < runs[r].tasks.size(); ++i) {
      const json& t = *runs[r].tasks[i];
      std::string key = task_key(t, i);
      auto [it, added] = index.emplace(key, rows.size());
      if (added)
        rows.push_back({task_name(t, i), std::vector<const json*>(runs.size(), nullptr)});
      auto& slot = rows[it->second].per_run[r];
      if (!slot)
        slot = &t;
    }
  return rows;
}

std::string speedup_bars(const std::vector<run_info>& runs, const std::vector<task_row>& rows) {
  bool several = runs.size() > 1, any_baseline = false;
  bar_chart chart;
  chart.axis_label = "speedup, log scale (1x: as fast as the reference, or the baseline)";
  for (const auto& row : rows) {
    bool baseline = false;
    for (const auto* t : row.per_run)
      baseline = baseline || (t && (number(*t, "speedup_vs_baseline") ||
                                    number(*t, "baseline_time_us")));
    any_baseline = any_baseline || baseline;
    chart_group g{row.name, {}};
    for (size_t r = 0; r < runs.size(); ++r) {
      const json* t = row.per_run[r];
      std::string who = several ? runs[r].mode + " " : "";
      if (!t) {
        g.bars.push_back({NAN, runs[r].colour, who + "not run", false});
        continue;
      }
      std::string timing = task_timing(*t, runs[r]);
      opt ref = number(*t, "speedup_vs_reference");
      chart_bar bar{ref ? *ref : NAN, runs[r].colour, "", false};
      if (task_failed(*t)) {
        bar.failure = true;
        bar.text = who + "failed: " + first_line(task_error(*t));
      } else if (!flag(*t, "correct")) {
        bar.failure = true;
        bar.text = who + "no correct kernel (reference kept, " + times(ref) + ")";
      } else {
        bar.text = fmt::format("{}vs reference {} ({})", who, times(ref), timing);
      }
      g.bars.push_back(bar);
      if (baseline) {
        opt b = number(*t, "speedup_vs_baseline");
        g.bars.push_back({b ? *b : NAN, runs[r].light,
                          b ? fmt::format("{}vs baseline {} ({})", who, times(b), timing)
                            : who + "vs baseline n/a",
                          false});
      }
    }
    chart.groups.push_back(std::move(g));
  }
  for (const auto& r : runs) {
    chart.legend.push_back({(several ? r.mode + " " : "") + "vs reference", r.colour});
    if (any_baseline)
      chart.legend.push_back({(several ? r.mode + " " : "") + "vs baseline", r.light});
  }
  return bar_chart_svg(chart) +
         "\n<p><small>A red cross marks a task without a correct kernel (its result is the "
         "reference, 1.0x); tasks without a baseline have no baseline bar.</small></p>\n";
}

// --- curves ------------------------------------------------------------------------------

// Geomean over the run's tasks of the best speedup after n candidates (n = 1..N); a task
// counts 1.0 until it has a correct kernel faster than the reference (the final result keeps
// the reference otherwise), and keeps its last value after its search stopped.
std::vector<double> geomean_curve(const run_info& r) {
  size_t n = 0;
  for (const auto* t : r.tasks) {
    const json& c = at(*t, "best_speedup_per_candidate");
    if (c.is_array())
      n = std::max(n, c.size());
  }
  if (r.tasks.empty() || n == 0)
    return {};
  std::vector<double> log_sum(n, 0.0);
  for (const auto* t : r.tasks) {
    const json& c = at(*t, "best_speedup_per_candidate");
    double best = 1.0;
    for (size_t i = 0; i < n; ++i) {
      if (c.is_array() && i < c.size()) {
        opt v = number(c[i]);
        if (v && *v > best)
          best = *v;
      }
      log_sum[i] += std::log(best);
    }
  }
  for (auto& v : log_sum)
    v = std::exp(v / static_cast<double>(r.tasks.size()));
  return log_sum;
}

std::string curves(const std::vector<run_info>& runs) {
  line_chart chart;
  chart.x_label = "candidates evaluated per task";
  size_t longest = 0;
  std::vector<std::vector<double>> all;
  for (const auto& r : runs) {
    auto ys = geomean_curve(r);
    longest = std::max(longest, ys.size());
    std::string name = fmt::format("{} ({})", r.mode, r.timing);
    if (!ys.empty())
      name += fmt::format(": {:.2f}x after {}", ys.back(), ys.size());
    chart.lines.push_back({name, r.colour, ys});
    all.push_back(std::move(ys));
  }
  if (longest == 0)
    return "<p>No candidate was evaluated (no best_speedup_per_candidate in any task).</p>\n";
  std::vector<size_t> marks;  // 1, 2, 4, ... and the longest
  for (size_t n = 1; n < longest; n *= 2)
    marks.push_back(n);
  marks.push_back(longest);
  std::string table = "<table>\n<tr><th>mode</th>";
  for (size_t n : marks)
    table += fmt::format("<th>after {}</th>", n);
  table += "</tr>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    table += "<tr>" + td(runs[r].mode + " (" + runs[r].timing + ")");
    for (size_t n : marks)
      table += td(all[r].empty() ? na : times(all[r][std::min(n, all[r].size()) - 1]));
    table += "</tr>\n";
  }
  return line_chart_svg(chart) +
         "\n<p><small>Geomean over all tasks of the best speedup against the reference after n "
         "candidates; a task counts 1.0x until it has a correct kernel faster than the "
         "reference, and keeps its last value once its search stopped.</small></p>\n" +
         table + "</table>\n";
}

// --- comparison --------------------------------------------------------------------------

std::string families_table(const std::vector<run_info>& runs) {
  std::string rows;
  for (const auto& r : runs) {
    const json& fam = at(*r.run, "families");
    if (!fam.is_object())
      continue;
    for (const auto& [name, f] : fam.items())
      rows += "<tr>" + td(r.mode) + td(name) + td(count(number(f, "tasks"))) +
              td(percent(number(f, "correct_rate"))) +
              td(times(number(f, "geomean_speedup_vs_reference")) + " " + r.timing) +
              td(count(number(f, "evaluations"))) + td(fixed(number(f, "worker_seconds"), 1)) +
              td(fixed(number(f, "device_seconds"), 3) + " " + r.timing) +
              td(fixed(number(f, "wall_seconds"), 1)) + "</tr>\n";
  }
  if (rows.empty())
    return "";
  return "<h3>Families</h3>\n<table>\n<tr><th>mode</th><th>family</th><th>tasks</th>"
         "<th>correct</th><th>geomean vs reference</th><th>evaluations</th>"
         "<th>worker CPU s</th><th>device s</th><th>wall s</th></tr>\n" +
         rows + "</table>\n";
}

std::string comparison(const json& bench, const std::vector<run_info>& runs) {
  const json& cmp = at(bench, "comparison");
  const json& rows = at(cmp, "rows");
  std::map<std::string, std::string> timing;
  for (const auto& r : runs)
    timing.emplace(r.mode, r.timing);
  std::string body;
  if (rows.is_array())
    for (const auto& row : rows) {
      if (!row.is_object())
        continue;
      std::string mode = text(row, "mode");
      auto it = timing.find(mode);
      std::string t = it == timing.end() ? "timing not stated" : it->second;
      body += "<tr>" + td(mode) + td(text(row, "family")) + td(count(number(row, "tasks"))) +
              td(percent(number(row, "correct_rate"))) +
              td(times(number(row, "geomean_speedup_vs_reference")) + " " + t) +
              td(count(number(row, "evaluations"))) +
              td(fixed(number(row, "worker_seconds"), 1)) +
              td(fixed(number(row, "device_seconds"), 3) + " " + t) +
              td(fixed(number(row, "wall_seconds"), 1)) + td(count(number(row, "tokens"))) +
              "</tr>\n";
    }
  std::string out;
  if (!body.empty())
    out = "<table>\n<tr><th>mode</th><th>family</th><th>tasks</th><th>correct</th>"
          "<th>geomean vs reference</th><th>evaluations</th><th>worker CPU s</th>"
          "<th>device s</th><th>wall s</th><th>tokens</th></tr>\n" +
          body + "</table>\n";
  else if (runs.size() < 2)
    out = "<p>One mode in this run: no comparison (<code>maxkernel bench --modes a,b</code> "
          "compares modes at equal budgets).</p>\n";
  else
    out = "<p>No comparison rows in this bench JSON.</p>\n";
  std::string rule = text(cmp, "rule");
  if (!rule.empty())
    out += "<p><strong>Rule:</strong> " + html_escape(rule) + "</p>\n";
  if (body.empty())
    out += families_table(runs);
  return out;
}

// --- profiles ----------------------------------------------------------------------------

std::string profiles(const std::vector<run_info>& runs) {
  stacked_chart chart;
  chart.parts = {{"compute", "#1565c0"},
                 {"exposed DMA", "#ef6c00"},
                 {"overhead", "#757575"},
                 {"outside kernels", "#8e24aa"},
                 {"other", "#bdbdbd"}};
  std::string rows;
  for (const auto& r : runs)
    for (size_t i = 0; i < r.tasks.size(); ++i) {
      const json& t = *r.tasks[i];
      const json& p = at(t, "profile");
      if (!p.is_object())
        continue;
      std::string name = task_name(t, i) + (runs.size() > 1 ? " (" + r.mode + ")" : "");
      std::string timing = text(p, "timing");
      if (timing.empty())
        timing = task_timing(t, r);
      double time = number(p, "time_us").value_or(0), outside = number(p, "outside_us").value_or(0);
      double compute = 0, exposed = 0, overhead = 0;
      const json& calls = at(p, "calls");
      if (calls.is_array())
        for (const auto& c : calls) {
          compute += number(c, "compute_us").value_or(0);
          exposed += number(c, "exposed_dma_us").value_or(0);
          overhead += number(c, "overhead_us").value_or(0);
        }
      double other = time - compute - exposed - overhead - outside;
      if (other < 0.01 * time)
        other = 0;
      std::string bound = text(p, "bound");
      chart.rows.push_back(  // the mode in the text: a long name's label is shortened
        {task_name(t, i),
         fmt::format("{}{} us {}{}", runs.size() > 1 ? r.mode + ": " : "",
                     fixed(number(p, "time_us")), timing,
                     bound.empty() ? "" : ", " + bound + "-bound"),
         {compute, exposed, overhead, outside, other}});
      opt roof = number(p, "roofline_us"), peak = number(p, "vmem_peak_bytes"),
          limit = number(p, "vmem_limit_bytes"), bw = number(p, "hbm_bandwidth");
      std::string notes;
      for (const char* key : {"notes", "unmodeled"}) {
        const json& list = at(p, key);
        if (list.is_array())
          for (const auto& n : list)
            notes += std::string(notes.empty() ? "" : "; ") +
                     (std::string(key) == "unmodeled" ? "not modeled: " : "") + text(n);
      }
      const json& diagnosis = at(t, "diagnosis");
      rows += "<tr>" + td(name) + td(timing) + td(fixed(number(p, "time_us"))) +
              td(fixed(roof)) +
              td(roof && time > 0 ? percent(*roof / time) : na) + td(bound) +
              td(fixed(compute)) + td(fixed(exposed)) + td(fixed(overhead)) +
              td(fixed(outside)) + td(fixed(other)) + td(fixed(number(p, "dma_us"))) +
              td(percent(number(p, "mxu_utilization"))) +
              td(bw ? fmt::format("{:.1f}", *bw / 1e9) : na) +
              td(fixed(number(p, "arithmetic_intensity"), 1)) +
              td(peak && limit && *limit > 0
                   ? fmt::format("{:.2f} / {:.2f}", *peak / 1048576.0, *limit / 1048576.0)
                   : na) +
              td(calls.is_array() ? std::to_string(calls.size()) : na) +
              td(text(diagnosis, "bottleneck")) + td(notes) + "</tr>\n";
    }
  if (chart.rows.empty())
    return "<p>No profile: no task has a best kernel with a profile.</p>\n";
  return stacked_bar_chart_svg(chart) +
         "\n<p><small>Each bar is the best kernel's time split into its kernels' compute, the "
         "DMA not hidden behind compute, per-step and launch overhead, and the XLA work "
         "outside the kernels (\"other\": what the profile does not attribute); the table "
         "has the same parts in us, and all DMA, hidden or not.</small></p>\n"
         "<table>\n<tr><th>task</th><th>timing</th><th>time us</th><th>roofline us</th>"
         "<th>of roofline</th><th>bound</th><th>compute us</th><th>exposed DMA us</th>"
         "<th>overhead us</th><th>outside kernels us</th><th>other us</th>"
         "<th>all DMA us</th><th>MXU</th><th>HBM GB/s</th>"
         "<th>flop/byte</th><th>VMEM MiB (peak / limit)</th><th>calls</th><th>bottleneck</th>"
         "<th>notes</th></tr>\n" +
         rows + "</table>\n";
}

// --- failures ----------------------------------------------------------------------------

std::map<std::string, double> failure_counts(const run_info& r) {
  std::map<std::string, double> out;
  auto add = [&](const json& f) {
    if (f.is_object())
      for (const auto& [cls, n] : f.items())
        out[cls] += number(n).value_or(0);
  };
  const json& f = at(*r.run, "failures");
  if (f.is_object()) {
    add(f);
  } else {  // the run did not sum them: the tasks' own
    for (const auto* t : r.tasks)
      add(at(*t, "failures"));
  }
  return out;
}

std::string failures(const std::vector<run_info>& runs) {
  std::vector<std::map<std::string, double>> counts;
  std::map<std::string, double> totals;
  for (const auto& r : runs) {
    counts.push_back(failure_counts(r));
    for (const auto& [cls, n] : counts.back())
      totals[cls] += n;
  }
  std::vector<std::string> classes;
  for (const auto& [cls, n] : totals)
    classes.push_back(cls);
  std::stable_sort(classes.begin(), classes.end(),
                   [&](const auto& a, const auto& b) { return totals[a] > totals[b]; });
  bool several = runs.size() > 1;
  std::string out;
  if (classes.empty()) {
    out = "<p>No candidate failures recorded.</p>\n";
  } else {
    bar_chart chart;
    chart.scale = chart_scale::linear;
    chart.unit = "";
    chart.axis_label = "failed candidates";
    for (const auto& cls : classes) {
      chart_group g{cls, {}};
      for (size_t r = 0; r < runs.size(); ++r) {
        double n = counts[r].count(cls) ? counts[r].at(cls) : 0;
        g.bars.push_back({n, runs[r].colour,
                          fmt::format("{}{:.0f}", several ? runs[r].mode + ": " : "", n), false});
      }
      chart.groups.push_back(std::move(g));
    }
    if (several)
      for (const auto& r : runs)
        chart.legend.push_back({r.mode, r.colour});
    out = bar_chart_svg(chart) + "\n";
  }
  out += "<table>\n<tr><th>class</th>";
  for (const auto& r : runs)
    out += th(r.mode);
  out += "</tr>\n";
  for (const auto& cls : classes) {
    out += "<tr>" + td(cls);
    for (size_t r = 0; r < runs.size(); ++r)
      out += td(count(counts[r].count(cls) ? counts[r].at(cls) : 0));
    out += "</tr>\n";
  }
  out += "<tr><th>tasks failed outside the search (error)</th>";
  for (const auto& r : runs)
    out += td(std::to_string(std::count_if(r.tasks.begin(), r.tasks.end(),
                                           [](const json* t) { return task_failed(*t); })));
  return out + "</tr>\n</table>\n<p><small>Classes count failed candidates; the last row "
               "counts tasks.</small></p>\n";
}

// --- per-task table ----------------------------------------------------------------------

std::string task_table(const std::vector<run_info>& runs) {
  std::set<std::string> timings;
  for (const auto& r : runs)
    for (const auto* t : r.tasks)
      timings.insert(task_timing(*t, r));
  // One timing for the whole table: in the headers; else in each time's cell.
  bool uniform = timings.size() == 1;
  std::string header_timing = uniform ? " (" + *timings.begin() + ")" : "";
  bool several = runs.size() > 1;
  std::string rows;
  for (const auto& r : runs)
    for (size_t i = 0; i < r.tasks.size(); ++i) {
      const json& t = *r.tasks[i];
      std::string cell_timing = uniform ? "" : " " + task_timing(t, r);
      auto us = [&](const char* key) {
        opt v = number(t, key);
        return v ? fmt::format("{:.2f}{}", *v, cell_timing) : na;
      };
      std::string failures;
      const json& f = at(t, "failures");
      if (f.is_object())
        for (const auto& [cls, n] : f.items())
          failures += (failures.empty() ? "" : ", ") + cls + ": " + count(number(n));
      const json& best = at(t, "best_candidate");
      std::string kernel = text(best, "template");
      if (!text(best, "strategy").empty())
        kernel += " (" + text(best, "strategy") + ")";
      if (at(best, "params").is_object() && !at(best, "params").empty())
        kernel += " " + compact(at(best, "params"));
      std::string status = task_status(t);
      std::string error = task_error(t);
      rows += std::string(status == "correct" ? "<tr>" : "<tr class=\"failed\">") +
              td(task_name(t, i)) + (several ? td(r.mode) : "") + td(text(t, "family")) +
              td(status) + td(at(t, "compiled").is_boolean() ? (flag(t, "compiled") ? "yes" : "no")
                                                             : na) +
              td(us("kernel_time_us")) + td(us("reference_time_us")) +
              td(us("baseline_time_us")) + td(times(number(t, "speedup_vs_reference"))) +
              td(times(number(t, "speedup_vs_baseline"))) +
              td(percent(number(t, "roofline_fraction"))) +
              td(count(number(t, "candidates_evaluated"))) + td(count(number(t, "evaluations"))) +
              td(count(number(t, "cache_hits"))) + td(text(t, "stop_reason")) + td(kernel) +
              td(fixed(number(t, "wall_seconds"), 1)) + td(count(number(t, "exit_code"))) +
              td(failures) + "<td class=\"err\">" + html_escape(error) + "</td></tr>\n";
    }
  if (rows.empty())
    return "<p>No tasks.</p>\n";
  return fmt::format("<table>\n<tr><th>task</th>{}<th>family</th><th>status</th>"
                     "<th>compiled</th><th>kernel us{t}</th><th>reference us{t}</th>"
                     "<th>baseline us{t}</th><th>vs reference</th><th>vs baseline</th>"
                     "<th>of roofline</th><th>candidates</th><th>evaluations</th>"
                     "<th>cache hits</th><th>stop reason</th><th>best kernel</th>"
                     "<th>wall s</th><th>exit</th><th>failures</th><th>error</th></tr>\n",
                     several ? "<th>mode</th>" : "", fmt::arg("t", html_escape(header_timing))) +
         rows + "</table>\n";
}

// --- the page ----------------------------------------------------------------------------

std::string page(const std::string& title, const std::string& body) {
  return "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + html_escape(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:2em}table{border-collapse:"
         "collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;"
         "text-align:left;vertical-align:top}tr.failed td{background:#fdecea}"
         "td.err{white-space:pre-wrap;color:#b71c1c;font-family:monospace}"
         "nav a{margin-right:1em}</style></head><body>\n" +
         body + "</body></html>\n";
}

// What the page's times are: each mode's timing is repeated where its times are.
std::string timing_sentence(const std::vector<run_info>& runs) {
  std::set<std::string> timings;
  for (const auto& r : runs)
    timings.insert(r.timing);
  if (timings.size() != 1)
    return "Each time is labelled with its mode's timing.";
  const std::string& t = *timings.begin();
  if (t == "modeled")
    return "All times are modeled (the TPU model, not a real TPU).";
  if (t == "measured")
    return "All times are measured on a real TPU.";
  return "Timing: " + t + ".";
}

std::string report(const json& bench) {
  auto runs = runs_of(bench);
  std::string suite = bench_text(bench, runs, "suite");
  std::string title = "maxkernel bench" + (suite.empty() ? "" : ": " + suite);
  if (runs.empty())
    return page(title, "<h1>" + html_escape(title) +
                         "</h1>\n<p>No tasks: this JSON holds no bench run (an object with "
                         "\"tasks\", or \"modes\" holding runs).</p>\n");
  std::string modes;
  for (const auto& r : runs)
    modes += (modes.empty() ? "" : ", ") + r.mode + " (" + r.timing + ")";
  std::string chip = bench_text(bench, runs, "chip");
  std::string budget = bench_text(bench, runs, "budget_evals");
  std::string body = "<h1>" + html_escape(title) + "</h1>\n<p>" +
                     html_escape(fmt::format("Suite {} on {}, a budget of {} evaluations per "
                                             "task; modes: {}. {}",
                                             suite.empty() ? na : suite, chip.empty() ? na : chip,
                                             budget.empty() ? na : budget, modes,
                                             timing_sentence(runs))) +
                     "</p>\n";
  size_t tasks = 0;
  for (const auto& r : runs)
    tasks += r.tasks.size();
  body += "<ul>\n";
  for (const auto& r : runs)
    body += headline(r);
  body += "</ul>\n";
  if (tasks == 0)
    return page(title, body + "<p><strong>No tasks:</strong> this bench ran no tasks, so "
                              "there is nothing to chart.</p>\n<h2>Summary per mode</h2>\n" +
                         summary_table(runs));
  auto rows = task_rows(runs);
  body += "<nav><a href=\"#summary\">summary</a><a href=\"#speedups\">speedups</a>"
          "<a href=\"#curves\">curves</a><a href=\"#comparison\">comparison</a>"
          "<a href=\"#profiles\">profiles</a><a href=\"#failures\">failures</a>"
          "<a href=\"#tasks\">tasks</a></nav>\n";
  body += "<h2 id=\"summary\">Summary per mode</h2>\n" + summary_table(runs);
  body += "<h2 id=\"speedups\">Speedup per task</h2>\n" + speedup_bars(runs, rows);
  body += "<h2 id=\"curves\">Best speedup versus candidates evaluated</h2>\n" + curves(runs);
  body += "<h2 id=\"comparison\">Mode comparison</h2>\n" + comparison(bench, runs);
  body += "<h2 id=\"profiles\">Profiles of the best kernels</h2>\n" + profiles(runs);
  body += "<h2 id=\"failures\">Failures by class</h2>\n" + failures(runs);
  body += "<h2 id=\"tasks\">Tasks</h2>\n" + task_table(runs);
  return page(title, body);
}

}  // namespace

std::string bench_report_html(const nlohmann::json& bench) {
  try {
    return report(bench);
  } catch (const std::exception& e) {  // a report never takes the bench down with it
    return page("maxkernel bench", "<h1>maxkernel bench</h1>\n<p>The report could not be "
                                   "built: " + html_escape(e.what()) + "</p>\n");
  }
}

}  // namespace maxkernel::cli
