#include "cli/workload_command.hpp"

#include "cli/bench_command.hpp"
#include "cli/output_file.hpp"
#include "cli/workload_report.hpp"
#include "config/workload_config.hpp"
#include "config/workload_expansion.hpp"
#include "search/state_dir.hpp"

#include <fmt/format.h>
#include <fnmatch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// --tasks: a task is kept when its name or one of its roles matches one of the globs.
bool selected(const config::workload_task& t, const std::string& globs) {
  if (globs.empty())
    return true;
  std::stringstream in(globs);
  std::string g;
  while (std::getline(in, g, ',')) {
    if (g.empty())
      continue;
    if (fnmatch(g.c_str(), t.name.c_str(), 0) == 0)
      return true;
    for (const auto& r : t.roles)
      if (fnmatch(g.c_str(), r.c_str(), 0) == 0)
        return true;
  }
  return false;
}

bool write_text(const fs::path& path, const std::string& text, std::string& error) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) {
    error = fmt::format("cannot write {}", path.string());
    return false;
  }
  return true;
}

}  // namespace

int run_workload(const workload_options& opts) {
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  auto bad = [&](const std::string& why) {
    std::cerr << "error: " << why << "\n";
    return 2;
  };
  std::string error;
  if (opts.mode != "auto" && opts.mode != "graph")
    return bad(fmt::format("--mode: `{}` is not one of auto, graph", opts.mode));
  if (opts.phase != "prefill" && opts.phase != "decode")
    return bad(fmt::format("--phase: `{}` is not one of prefill, decode", opts.phase));
  auto phase = opts.phase == "prefill" ? config::workload_phase::prefill
                                       : config::workload_phase::decode;
  auto model = config::load_workload_config(opts.model, error);
  if (!model)
    return bad(error);
  if (!output_dir_exists(opts.json, error))
    return bad(error);

  std::vector<config::workload_task> tasks;
  for (auto& t : config::expand_workload(*model, phase))
    if (selected(t, opts.tasks))
      tasks.push_back(std::move(t));
  if (tasks.empty())
    return bad(fmt::format("--tasks: no task of {} ({}) matches `{}`", model->name, opts.phase,
                           opts.tasks));

  // The specs go beside the outputs, or under the state directory: each is a task of its
  // own (its search graph and evaluations are keyed by its content, so a rerun resumes).
  std::string state_dir =
    opts.search.state_dir.empty() ? search::default_state_dir() : opts.search.state_dir;
  fs::path spec_dir;
  if (!opts.out.empty())
    spec_dir = fs::path(opts.out) / "specs" / opts.phase;
  else if (!state_dir.empty())
    spec_dir = fs::path(state_dir) / "workloads" / (model->name + "-" + opts.phase);
  else
    return bad("no state directory (no home): give --state-dir or --out");
  std::error_code ec;
  fs::create_directories(spec_dir, ec);
  if (ec) {
    std::cerr << "error: cannot create " << spec_dir.string() << ": " << ec.message() << "\n";
    return 3;
  }
  std::vector<suite_task> suite;
  for (const auto& t : tasks) {
    fs::path path = spec_dir / (t.name + ".yaml");
    if (!write_text(path, t.spec, error)) {
      std::cerr << "error: " << error << "\n";
      return 3;
    }
    suite.push_back({path.string(), t.name, t.name, spec_kind::native});
  }
  human << fmt::format("{} ({}): {} task(s) of one step written to {}\n", model->name, opts.phase,
                       tasks.size(), spec_dir.string());

  bench_options bench;
  bench.suite = opts.model;
  bench.modes = opts.mode;
  bench.jobs = opts.jobs;
  bench.out = opts.out;
  bench.search = opts.search;
  bench.cluster = opts.cluster;
  bench.token_file = opts.token_file;
  json run;
  int code = run_bench_tasks(bench, suite, human, run);
  if (code >= 2)
    return code;
  json report = workload_report(*model, phase, tasks, run);
  report["specs"] = spec_dir.string();
  report["budget_evals"] = opts.search.budget_evals;
  report["bench"] = std::move(run);
  human << workload_summary(report);
  if (!opts.json.empty() && !write_output(opts.json, report.dump(2) + "\n", error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return code;
}

}  // namespace maxkernel::cli
