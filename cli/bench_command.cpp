#include "cli/bench_command.hpp"

#include "agents/agent_pool_spawn.hpp"
#include "cli/bench_progress.hpp"
#include "cli/bench_report.hpp"
#include "cli/bench_suite.hpp"
#include "cli/bench_summary.hpp"
#include "cli/brain_options.hpp"
#include "cli/cluster_client.hpp"
#include "cli/hint_operator.hpp"
#include "cli/interrupt_stop.hpp"
#include "cli/optimize_outputs.hpp"
#include "cli/output_file.hpp"
#include "cli/task_search.hpp"
#include "cli/task_session.hpp"
#include "config/brain_config.hpp"
#include "maxkernel/schema/search.capnp.h"
#include "messages/version.hpp"
#include "search/state_dir.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// A mode's scope in the cluster's store when several modes run: bench-MODE, under the
// user's --store-scope when given.
std::string mode_store_scope(const std::string& scope, const std::string& mode) {
  return (scope.empty() ? "" : scope + "/") + "bench-" + mode;
}

// One row per task, `jobs` tasks at a time; row i is task(i), in suite order whatever the
// finishing order.
template <class Task>
std::vector<json> rows_on_threads(unsigned jobs, size_t n, Task task) {
  std::vector<json> rows(n);
  std::atomic<unsigned> next{0};
  std::vector<std::thread> threads;
  for (unsigned j = 0; j < jobs; ++j)
    threads.emplace_back([&] {
      for (unsigned i = next++; i < n; i = next++)
        rows[i] = task(i);
    });
  for (auto& t : threads)
    t.join();
  return rows;
}

bool parse_modes(const std::string& text, std::vector<std::string>& modes, std::string& error) {
  std::stringstream in(text);
  std::string m;
  std::set<std::string> seen;
  while (std::getline(in, m, ',')) {
    if (m != "auto" && m != "graph" && m != "hitl-hint") {
      error = fmt::format("--modes: `{}` is not one of auto, graph, hitl-hint", m);
      return false;
    }
    if (!seen.insert(m).second) {
      error = fmt::format("--modes: {} given twice", m);
      return false;
    }
    modes.push_back(m);
  }
  if (modes.empty()) {
    error = "--modes: give at least one of auto, graph, hitl-hint";
    return false;
  }
  return true;
}

// A task that failed before or outside its search: a row of the report all the same.
json failed_row(const suite_task& task, const std::string& mode, const std::string& chip,
                const std::string& name, int exit_code, const std::string& error,
                double wall_seconds) {
  return {{"schema", 1},
          {"task", name.empty() ? task.name : name},
          {"path", task.path},
          {"relative", task.relative},
          {"mode", mode},
          {"chip", chip},
          {"family", "unmatched"},
          {"correct", false},
          {"compiled", false},
          {"fallback_to_reference", true},
          {"kernel_time_us", nullptr},
          {"reference_time_us", nullptr},
          {"baseline_time_us", nullptr},
          {"speedup_vs_reference", 1.0},
          {"speedup_vs_baseline", nullptr},
          {"roofline_time_us", nullptr},
          {"roofline_fraction", nullptr},
          {"evaluations", 0},
          {"cache_hits", 0},
          {"failures", {{exit_code == 2 ? "taskBadInput" : "environment", 1}}},
          {"wall_seconds", wall_seconds},
          {"worker_seconds", 0.0},
          {"device_seconds", 0.0},
          {"tokens", {{"prompt", 0}, {"completion", 0}}},
          {"cost_usd", nullptr},
          {"error", error},
          {"exit_code", exit_code},
          {"profile", nullptr},
          {"best_speedup_per_candidate", json::array()}};
}

// What a bench row adds to result.json: the family of the best kernel, else of the first
// candidate ("" when the search had none).
void add_family(json& row, const std::string& first_template) {
  std::string tmpl = first_template;
  if (row.contains("best_candidate"))
    tmpl = row["best_candidate"].value("template", std::string());
  row["family"] = kernel_family(tmpl);
}

struct bench_run {
  const bench_options& opts;
  std::string mode;  // the label: auto, graph, hitl-hint
  node_session& session;
  const messages::agent_pool& pool;
  std::string state_dir;
  std::string out_dir;  // "" none
  bench_progress& progress;
};

json run_task(bench_run& run, const suite_task& task, unsigned index) {
  auto started = clock_type::now();
  auto search = run.opts.search;
  search.mode = run.mode == "hitl-hint" ? "hitl" : run.mode;
  search.spec = task.path;
  std::string chip = search.chip.empty() ? "v6e" : search.chip;
  run.progress.started(index, task.relative);
  auto fail = [&](int code, const std::string& name, const std::string& error) {
    auto row = failed_row(task, run.mode, chip, name, code, error, seconds_since(started));
    run.progress.finished(index, fmt::format("{}: failed ({})", task.relative, error), 1.0);
    return row;
  };

  std::string error;
  std::optional<messages::decoded_message> spec_msg;
  if (int code = load_task_spec(run.session, task.path, task.kind, search.chip,
                                search.memory_limit_bytes, spec_msg, error))
    return fail(code, "", error);
  spec_msg->allow_rereading();
  auto spec = spec_msg->root<schema::KernelSpec>();
  std::string name = spec.getName().cStr();

  prepared_search prepared;
  if (int code = prepare_search(run.session, spec, search, run.state_dir, prepared, error))
    return fail(code, name, error);
  auto& sys = run.session.system();
  auto listener = spawn_bench_listener(sys, run.progress, index);
  messages::operator_actor op;
  if (run.mode == "hitl-hint")
    op = spawn_hint_operator(sys);
  auto supervisor =
    spawn_supervisor(sys, search.mode, run.pool, run.session.evaluator(), listener, op);
  auto reply = await_search(sys, supervisor, prepared);
  caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(listener, caf::exit_reason::user_shutdown);
  if (op)
    caf::anon_send_exit(op, caf::exit_reason::user_shutdown);
  if (reply.exit_code != 0)
    return fail(reply.exit_code, name, reply.error);

  auto result = reply.root();
  auto outcome = outcome_of(prepared, search, run.session, seconds_since(started));
  auto row = result_json(spec, result, outcome);
  row["mode"] = run.mode;
  row["path"] = task.path;
  row["relative"] = task.relative;
  row["error"] = nullptr;
  row["exit_code"] = row["correct"].get<bool>() ? 0 : 1;
  add_family(row, result.getVertices().size() > 0
                    ? std::string(result.getVertices()[0].getCandidate().getTemplate().cStr())
                    : std::string());
  if (!run.out_dir.empty()) {
    auto dir = (fs::path(run.out_dir) / run.mode / task.relative).string();
    if (!make_output_dir(dir, error) ||
        !write_optimize_outputs(dir, spec, result, outcome, row, error)) {
      row["error"] = "--out: " + error;
      row["exit_code"] = 3;
    }
  }
  double speedup = row["speedup_vs_reference"].get<double>();
  run.progress.finished(
    index,
    fmt::format("{}: {} in {:.0f} s", task.relative,
                row["correct"].get<bool>()
                  ? fmt::format("{:.2f}x vs reference{}", speedup,
                                row["fallback_to_reference"].get<bool>() ? " (the reference)"
                                                                         : "")
                  : "no correct kernel",
                row["wall_seconds"].get<double>()),
    speedup);
  return row;
}

// A mode's run before its rows: the same fields embedded and on a cluster.
json mode_header(const bench_options& opts, const std::string& mode, const std::string& chip,
                 const std::string& backend, json nodes, json workers, unsigned jobs,
                 const std::string& jax_version, clock_type::time_point started) {
  return {{"schema", 1},
          {"suite", opts.suite},
          {"mode", mode},
          {"chip", chip},
          {"backend", backend},
          {"timing", backend == "model" ? "modeled" : backend.empty() ? "unknown" : "measured"},
          {"budget_evals", opts.search.budget_evals},
          {"budget_seconds", opts.search.budget_seconds},
          {"seed", opts.search.seed},
          {"nodes", std::move(nodes)},
          {"workers", std::move(workers)},
          {"jobs", jobs},
          {"jax_version", jax_version},
          {"maxkernel_version", messages::maxkernel_version()},
          {"wall_seconds", seconds_since(started)}};
}

// The first candidate's template of a search run on a cluster, from the graph.json it sent
// back (the supervisor's result.json already has the search's cost and the best profile).
std::string first_template(const fs::path& graph_file) {
  std::ifstream in(graph_file);
  json graph = in ? json::parse(in, nullptr, false) : json();
  if (!graph.is_object() || !graph.contains("vertices") || !graph["vertices"].is_array()
      || graph["vertices"].empty() || !graph["vertices"][0].is_object())
    return "";
  return graph["vertices"][0].value("template", std::string());
}

// The last "error: ..." line a run printed, without the prefix ("" none).
std::string last_error_line(const std::string& text) {
  std::string found;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("error: ", 0) == 0)
      found = line.substr(7);
  return found;
}

// One task as an optimize submission to the cluster: its row as run_task's.
json run_cluster_task(const bench_options& opts, const std::string& mode,
                      const suite_task& task, unsigned index, bench_progress& progress,
                      const fs::path& scratch, const std::atomic<bool>& interrupted) {
  auto started = clock_type::now();
  auto search = opts.search;
  search.mode = mode;
  std::string chip = search.chip.empty() ? "v6e" : search.chip;
  progress.started(index, task.relative);
  // The outputs come back to DIR/MODE/TASK with --out, else to a scratch directory (the
  // row's bench fields are read from graph.json).
  fs::path out = opts.out.empty() ? scratch / std::to_string(index)
                                  : fs::path(opts.out) / mode / task.relative;
  std::string error;
  json row;
  std::string printed;
  if (!make_output_dir(out.string(), error)) {
    row = failed_row(task, mode, chip, "", 3, "--out: " + error, seconds_since(started));
  } else {
    cluster_submission sub;
    sub.spec = task.path;
    sub.args = search_args(search);
    sub.out = out.string();
    sub.interrupted = &interrupted;
    sub.on_output = [&](const std::string& text, int stream) {
      if (stream == 2)
        printed += text;
    };
    auto outcome =
      run_cluster_submission(sub, {opts.cluster, opts.token_file, 30});
    json parsed = outcome.json.empty() ? json() : json::parse(outcome.json, nullptr, false);
    if (!parsed.is_object()) {
      std::string why = !outcome.error.empty() ? outcome.error : last_error_line(printed);
      if (why.empty())
        why = fmt::format("the run ended with exit code {} and no result", outcome.exit_code);
      row = failed_row(task, mode, chip, "", outcome.exit_code == 0 ? 3 : outcome.exit_code,
                       why, seconds_since(started));
    } else {
      row = std::move(parsed);
      row["mode"] = mode;
      row["path"] = task.path;
      row["relative"] = task.relative;
      row["error"] = nullptr;
      row["exit_code"] = row.value("correct", false) ? 0 : 1;
      add_family(row, first_template(out / "graph.json"));
    }
  }
  if (opts.out.empty()) {
    std::error_code ec;
    fs::remove_all(out, ec);
  }
  double speedup = row.value("speedup_vs_reference", 1.0);
  progress.finished(
    index,
    !row["error"].is_null()
      ? fmt::format("{}: failed ({})", task.relative, row["error"].get<std::string>())
      : fmt::format("{}: {} in {:.0f} s", task.relative,
                    row.value("correct", false)
                      ? fmt::format("{:.2f}x vs reference{}", speedup,
                                    row.value("fallback_to_reference", false) ? " (the reference)"
                                                                               : "")
                      : "no correct kernel",
                    row.value("wall_seconds", 0.0)),
    speedup);
  return row;
}

// Every task of a mode submitted to the cluster, `jobs` at once (0: all; the supervisor's
// dispatcher spreads their candidates over its nodes). The supervisor's evaluation store
// serves every run; with several modes, each mode's runs are answered only by what that
// mode stored (a scope of its own, as the embedded run's store of its own per mode), so
// their costs compare.
int run_mode_on_cluster(bench_options opts, const std::string& mode, bool own_scope,
                        const std::vector<suite_task>& tasks, std::ostream& human, json& out) {
  if (own_scope)
    opts.search.store_scope = mode_store_scope(opts.search.store_scope, mode);
  auto started = clock_type::now();
  // An unreachable supervisor or refused credentials end the run (3 or 2), not every task.
  if (int code = check_cluster({opts.cluster, opts.token_file, 30}, std::cerr))
    return code;
  unsigned jobs = opts.jobs ? opts.jobs : static_cast<unsigned>(tasks.size());
  jobs = std::max(1u, std::min<unsigned>(jobs, static_cast<unsigned>(tasks.size())));
  human << fmt::format("{}: {} task(s) of {}, {} at once on the cluster at {}, budget {} "
                       "candidates per task\n",
                       mode, tasks.size(), opts.suite, jobs, opts.cluster,
                       opts.search.budget_evals);
  std::error_code ec;
  auto scratch = fs::temp_directory_path(ec) /
                 fmt::format("maxkernel-bench-{}-{}", ::getpid(), mode);
  bench_progress progress(std::cerr, mode, static_cast<unsigned>(tasks.size()));
  // Ctrl-C stops every running search (their rows come back with the best so far) and
  // submits no more tasks (failed rows: interrupted); again, it ends this client at once.
  std::atomic<bool> interrupted{false};
  interrupt_stop ctrl_c(std::cerr);
  ctrl_c.on_search(stop_by_flag(interrupted));
  auto rows = rows_on_threads(jobs, tasks.size(), [&](unsigned i) {
    return run_cluster_task(opts, mode, tasks[i], i, progress, scratch, interrupted);
  });
  progress.close();
  fs::remove_all(scratch, ec);
  // What the supervisor's runs said about where they ran.
  std::string backend, jax_version;
  json nodes = nullptr;
  for (const auto& r : rows)
    if (r.contains("backend") && backend.empty()) {
      backend = r.value("backend", std::string());
      jax_version = r.value("jax_version", std::string());
      nodes = r.value("nodes", json(nullptr));
    }
  json header = mode_header(opts, mode, opts.search.chip.empty() ? "v6e" : opts.search.chip,
                            backend, nodes, nullptr, jobs, jax_version, started);
  header["cluster"] = opts.cluster;
  header["store_scope"] = opts.search.store_scope;
  out = summarize_run(std::move(header), std::move(rows));
  return 0;
}

// Runs every task under one mode: a node session of its own (with several modes, an
// evaluation store of its own), `jobs` tasks at once.
int run_mode(const bench_options& opts, const std::string& mode, bool own_store,
             const std::vector<suite_task>& tasks, const config::brain_config& brains,
             const std::string& state_dir, std::ostream& human, json& out) {
  auto started = clock_type::now();
  session_options sopts;
  sopts.chip = opts.search.chip.empty() ? "v6e" : opts.search.chip;
  sopts.state_dir = own_store ? (fs::path(state_dir) / ("bench-" + mode)).string() : state_dir;
  sopts.use_store = !opts.search.no_store;
  sopts.simulate_device = std::chrono::milliseconds(opts.search.simulate_device_ms);
  sopts.memory_limit_bytes = opts.search.memory_limit_bytes;
  sopts.deadline =
    std::chrono::milliseconds(static_cast<int64_t>(opts.search.deadline_seconds * 1000));
  sopts.nodes = opts.search.nodes;
  sopts.workers = opts.search.workers;
  sopts.dispatch = true;
  std::error_code ec;
  fs::create_directories(sopts.state_dir, ec);
  node_session session(sopts);
  std::string error;
  if (!session.start(error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  unsigned jobs = opts.jobs ? opts.jobs : 2 * session.workers();
  jobs = std::min<unsigned>(jobs, static_cast<unsigned>(tasks.size()));
  human << fmt::format("{}: {} task(s) of {}, {} at once, {} node(s), {} worker(s), budget {} "
                       "candidates per task\n",
                       mode, tasks.size(), opts.suite, jobs, session.nodes(), session.workers(),
                       opts.search.budget_evals);
  auto pool = agents::spawn_agent_pool(session.system(), agents::make_brain_chains(brains));
  bench_progress progress(std::cerr, mode, static_cast<unsigned>(tasks.size()));
  bench_run run{opts, mode, session, pool, sopts.state_dir, opts.out, progress};
  auto rows = rows_on_threads(jobs, tasks.size(), [&](unsigned i) {
    return run_task(run, tasks[i], i);
  });
  progress.close();
  agents::stop_agent_pool(pool);

  json header = mode_header(opts, mode, sopts.chip, session.backend(), session.nodes(),
                            session.workers(), jobs, session.jax_version(), started);
  out = summarize_run(std::move(header), std::move(rows));
  return 0;
}

std::string percent(const json& j, const char* key) {
  return fmt::format("{:.0f}%", 100 * j.value(key, 0.0));
}

// The readable table of one run.
std::string run_summary(const json& run) {
  std::string s = fmt::format(
    "{} on {} ({}): {} tasks; compile {}, correct {}, fast_1 {}, fast_1.5 {}, fast_2 {}; "
    "geomean {:.3f}x vs reference",
    run.value("mode", ""), run.value("chip", ""), run.value("timing", ""),
    run.value("tasks_total", 0), percent(run, "compile_rate"), percent(run, "correct_rate"),
    percent(run, "fast_1"), percent(run, "fast_1_5"), percent(run, "fast_2"),
    run.value("geomean_speedup_vs_reference", 1.0));
  if (run["geomean_speedup_vs_baseline"].is_number())
    s += fmt::format(", {:.3f}x vs baseline (at least as fast on {}/{})",
                     run["geomean_speedup_vs_baseline"].get<double>(),
                     run.value("baseline_at_least_as_fast", 0), run.value("baseline_tasks", 0));
  s += fmt::format("; {} evaluations ({} from the store), {:.0f} s\n",
                   run.value("evaluations", 0), run.value("cache_hits", 0),
                   run.value("wall_seconds", 0.0));
  for (const auto& t : run["tasks"]) {
    std::string vs_baseline = t["speedup_vs_baseline"].is_number()
                                ? fmt::format("{:.2f}x", t["speedup_vs_baseline"].get<double>())
                                : "-";
    std::string what =
      !t["error"].is_null() ? "failed: " + t["error"].get<std::string>()
      : t.value("correct", false)
        ? (t.value("fallback_to_reference", false) ? "correct (the reference is faster)"
                                                   : "correct")
        : "no correct kernel";
    s += fmt::format("  {:<48} {:>7.2f}x {:>7} {:>4} evals {:>6.0f} s  {}\n",
                     t.value("relative", t.value("task", "")),
                     t.value("speedup_vs_reference", 1.0), vs_baseline, t.value("evaluations", 0),
                     t.value("wall_seconds", 0.0), what);
  }
  return s;
}

}  // namespace

namespace {

// The command line's checks shared by `bench` and the callers that bring their own tasks.
bool check_options(const bench_options& opts, std::vector<std::string>& modes,
                   std::string& error) {
  if (!parse_modes(opts.modes, modes, error))
    return false;
  for (const auto& m : modes) {
    auto check = opts.search;
    check.mode = m == "hitl-hint" ? "hitl" : m;
    if (!valid_optimize_options(check, error))
      return false;
  }
  if (!opts.cluster.empty() &&
      std::find(modes.begin(), modes.end(), "hitl-hint") != modes.end()) {
    error = "--cluster runs auto and graph (hitl-hint needs a local operator)";
    return false;
  }
  if (opts.cluster.empty() && !opts.token_file.empty()) {
    error = "--token-file goes with --cluster";
    return false;
  }
  if (opts.search.budget_evals == 0 && opts.search.budget_seconds <= 0 &&
      opts.search.patience == 0) {
    error = "a task's search has no end: give --budget-evals, --budget-seconds or --patience";
    return false;
  }
  return true;
}

// Every mode over `tasks`: the bench JSON in `bench` (one run, or the modes and their
// comparison). 0, or 2 / 3 with the error printed.
int run_modes(const bench_options& opts, const std::vector<std::string>& modes,
              const std::vector<suite_task>& tasks, std::ostream& human, json& bench) {
  std::string error;
  auto bad = [&](const std::string& why) {
    std::cerr << "error: " << why << "\n";
    return 2;
  };
  config::brain_config brains;
  if (!load_brains(opts.search.brains, brains, error))
    return bad(error);
  if (!opts.out.empty() && !make_output_dir(opts.out, error))
    return bad(error);
  std::string state_dir =
    opts.search.state_dir.empty() ? search::default_state_dir() : opts.search.state_dir;
  if (state_dir.empty())
    return bad("no state directory (no home): give --state-dir");

  std::vector<json> runs;
  for (const auto& mode : modes) {
    json run;
    int code = opts.cluster.empty()
                 ? run_mode(opts, mode, modes.size() > 1, tasks, brains, state_dir, human, run)
                 : run_mode_on_cluster(opts, mode, modes.size() > 1, tasks, human, run);
    if (code)
      return code;
    human << run_summary(run);
    runs.push_back(std::move(run));
  }
  if (runs.size() == 1) {
    bench = runs.front();
  } else {
    bench = {{"schema", 1},
             {"suite", opts.suite},
             {"chip", runs.front().value("chip", "")},
             {"budget_evals", opts.search.budget_evals},
             {"modes", runs},
             {"comparison", compare_modes(runs)}};
    human << "mode choice: " << bench["comparison"]["rule"].get<std::string>() << "\n";
  }
  return 0;
}

// 0 when every task of every mode has a correct kernel, else 1.
int bench_exit_code(const json& bench) {
  std::vector<json> runs = bench.contains("modes") ? bench["modes"].get<std::vector<json>>()
                                                   : std::vector<json>{bench};
  for (const auto& run : runs)
    for (const auto& t : run["tasks"])
      if (!t.value("correct", false))
        return 1;
  return 0;
}

}  // namespace

int run_bench(const bench_options& opts) {
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  std::string error;
  std::vector<std::string> modes;
  auto bad = [&](const std::string& why) {
    std::cerr << "error: " << why << "\n";
    return 2;
  };
  if (!check_options(opts, modes, error))
    return bad(error);
  if (!output_dir_exists(opts.json, error) || !output_dir_exists(opts.html, error))
    return bad(error);
  std::vector<suite_task> tasks;
  if (!find_suite_tasks(opts.suite, opts.tasks, tasks, error))
    return bad(error);
  json bench;
  if (int code = run_modes(opts, modes, tasks, human, bench))
    return code;
  if (!opts.html.empty() && !write_output(opts.html, bench_report_html(bench), error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  if (!opts.json.empty() && !write_output(opts.json, bench.dump(2) + "\n", error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return bench_exit_code(bench);
}

int run_bench_tasks(const bench_options& opts, const std::vector<suite_task>& tasks,
                    std::ostream& human, nlohmann::json& bench) {
  std::string error;
  std::vector<std::string> modes;
  if (!check_options(opts, modes, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (int code = run_modes(opts, modes, tasks, human, bench))
    return code;
  return bench_exit_code(bench);
}

}  // namespace maxkernel::cli
