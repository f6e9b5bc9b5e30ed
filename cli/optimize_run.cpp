#include "cli/optimize_run.hpp"

#include "actors/search_record.hpp"
#include "agents/agent_pool_spawn.hpp"
#include "cli/operator_console.hpp"
#include "cli/optimize_outputs.hpp"
#include "cli/output_file.hpp"
#include "cli/progress_line.hpp"
#include "cli/task_search.hpp"
#include "cluster/operator_gateway.hpp"
#include "maxkernel/schema/search.capnp.h"
#include "messages/error.hpp"
#include "search/search_graph.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <unistd.h>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

int optimize_on_session(node_session& session, schema::KernelSpec::Reader spec,
                        const optimize_options& opts, const config::brain_config& brains,
                        const std::string& state_dir, clock_type::time_point started,
                        run_io io) {
  std::string error;
  auto& human = io.human;
  auto& err = io.err;
  prepared_search prepared;
  if (int code = prepare_search(session, spec, opts, state_dir, prepared, error)) {
    err << "error: " << error << "\n";
    return code;
  }
  const auto& times = prepared.times;
  const auto& chip_name = prepared.chip;
  auto cluster_before = session.cluster_counts_now();
  if (cluster_before)
    session.learn_jax_version();  // result.json names it, as embedded
  human << fmt::format("{}: reference {:.2f} us{} (modeled on {}); {} search, {}\n",
                       spec.getName().cStr(), times.reference_us,
                       times.baseline_us > 0 ? fmt::format(", baseline {:.2f} us", times.baseline_us)
                                             : "",
                       chip_name, opts.mode,
                       cluster_before
                         ? fmt::format("{} node(s) of the cluster", cluster_before->alive)
                         : fmt::format("{} node(s), {} worker(s)", session.nodes(),
                                       session.workers()));

  auto& sys = session.system();
  auto pool = agents::spawn_agent_pool(sys, agents::make_brain_chains(brains));
  auto listener = spawn_progress_line(sys, err, opts.budget_evals, session.dispatcher());
  std::optional<cluster::operator_gateway> gateway;
  std::thread console;
  if (opts.mode == "hitl") {
    cluster::operator_gateway_config gw;
    gw.endpoint = opts.operator_endpoint;
    gw.token_file = opts.operator_token_file;
    gw.welcome = fmt::format("{}: hitl search on {} (reference {:.2f} us, modeled)",
                             spec.getName().cStr(), chip_name, times.reference_us);
    auto spawned = cluster::spawn_operator_gateway(sys, gw);
    if (!spawned) {
      agents::stop_agent_pool(pool);
      caf::anon_send_exit(listener, caf::exit_reason::user_shutdown);
      err << "error: --operator-endpoint: " << messages::message_of(spawned.error())
                << "\n";
      return 2;
    }
    gateway = std::move(*spawned);
    // On stderr even with --json -: the operator needs it to attach.
    err << "operator gateway: " << gateway->endpoint << " (attach with: maxkernel attach "
        << gateway->endpoint << (opts.operator_token_file.empty() ? "" : " --token-file TOKEN")
        << ")\n";
    if (opts.console) {
      // This terminal is an operator too: the console attaches over the gateway's socket
      // as any shell does, reading decisions from stdin.
      console_options co;
      co.endpoint = gateway->endpoint;
      co.prompt = ::isatty(STDIN_FILENO) == 1;
      console = std::thread([co, &err] { run_console(co, std::cin, std::cout, err); });
    }
  }
  auto supervisor = spawn_supervisor(sys, opts.mode, pool, session.evaluator(), listener,
                                     gateway ? gateway->handle : messages::operator_actor{});
  if (io.on_search)
    io.on_search(controller_of(sys, supervisor));
  auto reply = await_search(sys, supervisor, prepared);
  if (io.on_search)
    io.on_search(nullptr);
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
    // The progress line writes to `err`, which a cluster submission destroys when its run
    // ends: the listener must be gone first, not merely told to go.
    self->wait_for(listener);
  }
  agents::stop_agent_pool(pool);
  end_progress_line(err);
  if (reply.exit_code != 0) {
    err << "error: " << reply.error << "\n";
    return reply.exit_code;
  }
  auto result = reply.root();
  auto outcome = outcome_of(prepared, opts, session,
                            std::chrono::duration<double>(clock_type::now() - started).count());
  auto json = result_json(spec, result, outcome);
  if (cluster_before) {
    json["nodes"] = cluster_before->alive;
    if (auto after = session.cluster_counts_now()) {
      json["nodes_lost"] = after->nodes_lost - cluster_before->nodes_lost;
      json["redispatched"] = after->orphaned - cluster_before->orphaned;
    }
  }
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
      err << "error: search.sqlite: " << error << "\n";
      return 3;
    }
    if (!write_optimize_outputs(opts.out, spec, result, outcome, json, error)) {
      err << "error: " << error << "\n";
      return 3;
    }
    human << "wrote " << (io.out_shown.empty() ? opts.out : io.out_shown)
          << "/{kernel.py, result.json, search.sqlite, graph.json, graph.dot, report.html"
          << (result.getTranscript().size() ? ", transcript.jsonl}\n" : "}\n");
  }
  if (io.json_text)
    *io.json_text = json.dump(2) + "\n";
  if (!opts.json.empty() && !write_output(opts.json, json.dump(2) + "\n", error)) {
    err << "error: " << error << "\n";
    return 3;
  }
  return json["correct"].get<bool>() ? 0 : 1;
}

}  // namespace maxkernel::cli
