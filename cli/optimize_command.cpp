#include "cli/optimize_command.hpp"

#include "actors/search_record.hpp"
#include "agents/agent_pool_spawn.hpp"
#include "cli/brain_options.hpp"
#include "cli/interrupt_stop.hpp"
#include "cli/operator_console.hpp"
#include "cli/optimize_outputs.hpp"
#include "cli/optimize_run.hpp"
#include "cli/output_file.hpp"
#include "cli/progress_line.hpp"
#include "cli/task_search.hpp"
#include "cli/task_session.hpp"
#include "cluster/operator_gateway.hpp"
#include "config/brain_config.hpp"
#include "maxkernel/schema/search.capnp.h"
#include "messages/error.hpp"
#include "search/search_graph.hpp"
#include "search/selection_policy.hpp"
#include "search/state_dir.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <unistd.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <thread>
#include <filesystem>
#include <iostream>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {
// --store-scope's text: false with the reason.
bool valid_store_scope(const std::string& scope, std::string& error) {
  // It becomes part of every evaluation key and travels in the cluster's submissions.
  bool ok = scope.size() <= 100 && std::all_of(scope.begin(), scope.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == '/';
  });
  if (!ok)
    error = fmt::format("--store-scope {}: up to 100 letters, digits, '.', '_', '-' or '/'",
                        scope);
  return ok;
}
}  // namespace

bool valid_optimize_options(const optimize_options& opts, std::string& error) {
  if (opts.mode != "auto" && opts.mode != "graph" && opts.mode != "hitl") {
    error = fmt::format("--mode {}: one of auto, graph, hitl", opts.mode);
    return false;
  }
  if (opts.on_timeout != "wait" && opts.on_timeout != "approve" && opts.on_timeout != "stop") {
    error = fmt::format("--on-timeout {}: one of wait, approve, stop", opts.on_timeout);
    return false;
  }
  if (opts.console && opts.mode != "hitl") {
    error = "--console: only with --mode hitl";
    return false;
  }
  if (opts.console && opts.json == "-") {
    error = "--console with --json -: the console needs stdout; write the JSON to a file";
    return false;
  }
  if (!(opts.operator_timeout >= 0)) {
    error = "--operator-timeout: seconds, 0 or more";
    return false;
  }
  if (!search::parse_policy(opts.policy)) {
    error = fmt::format("--policy {}: one of beam, bandit", opts.policy);
    return false;
  }
  if (opts.nodes == 0) {
    error = "--nodes: at least 1";
    return false;
  }
  // hitl ends when the operator says stop.
  if (opts.mode != "hitl" && opts.budget_evals == 0 && opts.budget_seconds <= 0 &&
      opts.patience == 0) {
    error = "the search has no end: give --budget-evals, --budget-seconds or --patience";
    return false;
  }
  if (!valid_store_scope(opts.store_scope, error))
    return false;
  if (opts.target_roofline < 0 || opts.target_roofline > 1) {
    error = "--target-roofline: a fraction between 0 and 1";
    return false;
  }
  return output_dir_exists(opts.json, error);
}

bool read_optimize_inputs(const optimize_options& opts, spec_kind& kind,
                          config::brain_config& brains, std::string& error) {
  if (!valid_optimize_options(opts, error))
    return false;
  kind = classify_spec(opts.spec, error);
  return kind != spec_kind::invalid && load_brains(opts.brains, brains, error);
}

int run_optimize(const optimize_options& opts) {
  auto started = clock_type::now();
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  std::string error;
  spec_kind kind;
  config::brain_config brains;
  if (!read_optimize_inputs(opts, kind, brains, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  std::string state_dir = opts.state_dir.empty() ? search::default_state_dir() : opts.state_dir;
  if (state_dir.empty()) {
    std::cerr << "error: no state directory (no home): give --state-dir\n";
    return 2;
  }

  task_session task;
  session_flags flags{opts.chip, state_dir, opts.no_store, opts.simulate_device_ms,
                      opts.memory_limit_bytes, opts.deadline_seconds};
  flags.nodes = opts.nodes;
  flags.workers = opts.workers;
  flags.dispatch = true;
  if (int code = open_task_session(opts.spec, kind, flags, task))
    return code;
  // --out is made only once the task is read: a bad spec leaves no directory behind.
  if (!opts.out.empty() && !make_output_dir(opts.out, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  interrupt_stop ctrl_c(std::cerr);
  run_io io{human, std::cerr, nullptr, ""};
  io.on_search = [&ctrl_c](search_controller c) { ctrl_c.on_search(std::move(c)); };
  return optimize_on_session(*task.session, task.spec(), opts, brains, state_dir, started,
                             std::move(io));
}

}  // namespace maxkernel::cli
