#include "cli/task_search.hpp"

#include "actors/auto_supervisor.hpp"
#include "actors/graph_supervisor.hpp"
#include "actors/hitl_supervisor.hpp"
#include "cli/task_session.hpp"
#include "maxkernel/schema/search.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "search/state_dir.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

namespace maxkernel::cli {

int prepare_search(node_session& session, schema::KernelSpec::Reader spec,
                   const optimize_options& opts, const std::string& state_dir,
                   prepared_search& out, std::string& error) {
  if (int code = task_chip(opts.chip, spec, out.chip, error))
    return code;
  if (int code = analyze_reference(session, spec, out.analysis, error))
    return code;
  out.times = time_reference_and_baseline(session, spec, out.chip, opts.store_scope);
  out.graph_path = search::default_store_path(state_dir);

  auto req = out.request->initRoot<schema::OptimizeRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.setSpec(spec);
  req.setAnalysis(out.analysis->root<schema::DataflowGraph>());
  auto s = req.initSettings();
  s.setMode(opts.mode);
  s.setChip(out.chip);
  s.setSeed(opts.seed);
  s.setBudgetEvals(opts.budget_evals);
  s.setBudgetSeconds(opts.budget_seconds);
  s.setMaxRepairs(opts.max_repairs);
  s.setTestEveryCandidate(opts.test_every_candidate);
  s.setPatience(opts.patience);
  s.setTargetRoofline(opts.target_roofline);
  s.setBeamWidth(opts.beam_width);
  s.setBranching(opts.branching);
  s.setPolicy(opts.policy);
  s.setDive(!opts.no_dive);
  s.setDeadlineMs(static_cast<uint32_t>(opts.deadline_seconds * 1000));
  s.setOperatorTimeoutSeconds(opts.operator_timeout);
  s.setOnTimeout(opts.on_timeout);
  s.setStoreScope(opts.store_scope);
  req.setReferenceTimeUs(out.times.reference_us);
  req.setGraphPath(out.graph_path);
  req.setResume(opts.resume);
  return 0;
}

messages::supervisor_actor spawn_supervisor(caf::actor_system& sys, const std::string& mode,
                                            const messages::agent_pool& pool,
                                            messages::tpu_node_actor evaluator,
                                            messages::progress_listener_actor listener,
                                            messages::operator_actor op) {
  if (mode == "graph")
    return actors::spawn_graph_supervisor(sys, pool, std::move(evaluator), std::move(listener));
  if (mode == "hitl")
    return actors::spawn_hitl_supervisor(sys, pool, std::move(evaluator), std::move(listener),
                                         std::move(op));
  return actors::spawn_auto_supervisor(sys, pool, std::move(evaluator), std::move(listener));
}

search_controller controller_of(caf::actor_system& sys, messages::supervisor_actor supervisor) {
  return [&sys, supervisor](const std::string& control, std::string& progress,
                            std::string& error) {
    bool ok = false;
    caf::scoped_actor self{sys};
    self
      ->request(supervisor, std::chrono::seconds(10), messages::control_atom::value,
                messages::payload{capnp::typeId<schema::SearchControl>(), control})
      .receive(
        [&](messages::payload& reply) {
          progress = std::move(reply.bytes);
          ok = true;
        },
        [&](caf::error& e) { error = messages::message_of(e); });
    return ok;
  };
}

search_reply await_search(caf::actor_system& sys, const messages::supervisor_actor& supervisor,
                          prepared_search& prepared) {
  search_reply out;
  caf::scoped_actor self{sys};
  self
    ->request(supervisor, caf::infinite, messages::optimize_atom::value,
              messages::make_payload<schema::OptimizeRequest>(*prepared.request))
    .receive(
      [&](messages::payload& reply) {
        out.result = messages::open_payload<schema::OptimizeResult>(reply, out.error);
        if (!out.result)
          out.exit_code = 3;
        else
          out.result->allow_rereading();
      },
      [&](caf::error& e) {
        out.error = messages::message_of(e);
        out.exit_code = messages::exit_code_for(messages::code_of(e));
        if (out.exit_code == 0)
          out.exit_code = 3;
      });
  return out;
}

optimize_outcome outcome_of(const prepared_search& prepared, const optimize_options& opts,
                            node_session& session, double wall_seconds) {
  optimize_outcome o;
  o.mode = opts.mode;
  o.chip = prepared.chip;
  o.backend = session.backend();
  o.jax_version = session.jax_version();
  o.seed = opts.seed;
  o.reference_us = prepared.times.reference_us;
  o.baseline_us = prepared.times.baseline_us;
  o.extra_evaluations = prepared.times.evaluations;
  o.extra_cache_hits = prepared.times.cache_hits;
  o.wall_seconds = wall_seconds;
  o.nodes = session.nodes();
  return o;
}

}  // namespace maxkernel::cli
