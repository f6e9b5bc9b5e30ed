#include "cli/optimize_command.hpp"

#include "actors/search_record.hpp"
#include "agents/agent_pool_spawn.hpp"
#include "cli/brain_options.hpp"
#include "cli/operator_console.hpp"
#include "cli/optimize_outputs.hpp"
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

#include <chrono>
#include <thread>
#include <filesystem>
#include <iostream>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

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
  if (opts.target_roofline < 0 || opts.target_roofline > 1) {
    error = "--target-roofline: a fraction between 0 and 1";
    return false;
  }
  return output_dir_exists(opts.json, error);
}

int run_optimize(const optimize_options& opts) {
  auto started = clock_type::now();
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  std::string error;
  if (!valid_optimize_options(opts, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  auto kind = classify_spec(opts.spec, error);
  if (kind == spec_kind::invalid) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  config::brain_config brains;
  if (!load_brains(opts.brains, brains, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (!opts.out.empty() && !make_output_dir(opts.out, error)) {
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
  auto& session = *task.session;
  auto spec = task.spec();
  prepared_search prepared;
  if (int code = prepare_search(session, spec, opts, state_dir, prepared, error)) {
    std::cerr << "error: " << error << "\n";
    return code;
  }
  const auto& times = prepared.times;
  const auto& chip_name = prepared.chip;
  human << fmt::format("{}: reference {:.2f} us{} (modeled on {}); {} search, {} node(s), {} "
                       "worker(s)\n",
                       spec.getName().cStr(), times.reference_us,
                       times.baseline_us > 0 ? fmt::format(", baseline {:.2f} us", times.baseline_us)
                                             : "",
                       chip_name, opts.mode, session.nodes(), session.workers());

  auto& sys = session.system();
  auto pool = agents::spawn_agent_pool(sys, agents::make_brain_chains(brains));
  auto listener = spawn_progress_line(sys, std::cerr, opts.budget_evals, session.dispatcher());
  std::optional<cluster::operator_gateway> gateway;
  std::thread console;
  if (opts.mode == "hitl") {
    cluster::operator_gateway_config gw;
    gw.endpoint = opts.operator_endpoint;
    gw.welcome = fmt::format("{}: hitl search on {} (reference {:.2f} us, modeled)",
                             spec.getName().cStr(), chip_name, times.reference_us);
    auto spawned = cluster::spawn_operator_gateway(sys, gw);
    if (!spawned) {
      agents::stop_agent_pool(pool);
      caf::anon_send_exit(listener, caf::exit_reason::user_shutdown);
      std::cerr << "error: --operator-endpoint: " << messages::message_of(spawned.error())
                << "\n";
      return 2;
    }
    gateway = std::move(*spawned);
    // On stderr even with --json -: the operator needs it to attach.
    std::cerr << "operator gateway: " << gateway->endpoint << " (attach with: maxkernel attach "
              << gateway->endpoint << ")\n";
    if (opts.console) {
      // This terminal is an operator too: the console attaches over the gateway's socket
      // as any shell does, reading decisions from stdin.
      console_options co;
      co.endpoint = gateway->endpoint;
      co.prompt = ::isatty(STDIN_FILENO) == 1;
      console = std::thread([co] { run_console(co, std::cin, std::cout, std::cerr); });
    }
  }
  auto supervisor = spawn_supervisor(sys, opts.mode, pool, session.evaluator(), listener,
                                     gateway ? gateway->handle : messages::operator_actor{});
  auto reply = await_search(sys, supervisor, prepared);
  {
    caf::scoped_actor self{sys};
    self->send_exit(supervisor, caf::exit_reason::user_shutdown);
    self->send_exit(listener, caf::exit_reason::user_shutdown);
    if (gateway) {
      // The supervisor's last notice (the end) is in the gateway's mailbox before its reply
      // came: one round trip makes sure the gateway handled it before it is stopped.
      self->request(gateway->handle, std::chrono::seconds(5), messages::status_atom::value)
        .receive([](uint32_t) {}, [](caf::error&) {});
      self->send_exit(gateway->handle, caf::exit_reason::user_shutdown);
    }
    // The console leaves on the gateway's `ended` (or when the gateway stops).
    if (console.joinable())
      console.join();
  }
  agents::stop_agent_pool(pool);
  end_progress_line(std::cerr);
  if (reply.exit_code != 0) {
    std::cerr << "error: " << reply.error << "\n";
    return reply.exit_code;
  }
  auto result = reply.root();
  auto outcome = outcome_of(prepared, opts, session,
                            std::chrono::duration<double>(clock_type::now() - started).count());
  auto json = result_json(spec, result, outcome);
  human << summary_line(spec, result, outcome);

  if (!opts.out.empty()) {
    // The search alone, as a one-file database beside the kernel.
    auto graph = search::search_graph::open(prepared.graph_path, error);
    bool resumed = false;
    if (!graph ||
        !graph->begin(actors::search_header_for(
                        spec, prepared.request->getRoot<schema::OptimizeRequest>()
                                .getSettings()
                                .asReader()),
                      true,
                      resumed, error) ||
        !graph->copy_to((fs::path(opts.out) / "search.sqlite").string(), error)) {
      std::cerr << "error: search.sqlite: " << error << "\n";
      return 3;
    }
    if (!write_optimize_outputs(opts.out, spec, result, outcome, json, error)) {
      std::cerr << "error: " << error << "\n";
      return 3;
    }
    human << "wrote " << opts.out
          << "/{kernel.py, result.json, search.sqlite, graph.json, graph.dot, report.html"
          << (result.getTranscript().size() ? ", transcript.jsonl}\n" : "}\n");
  }
  if (!opts.json.empty() && !write_output(opts.json, json.dump(2) + "\n", error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return json["correct"].get<bool>() ? 0 : 1;
}

}  // namespace maxkernel::cli
