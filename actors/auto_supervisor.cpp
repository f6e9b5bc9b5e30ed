#include "actors/auto_supervisor.hpp"

#include "actors/lineage.hpp"
#include "actors/supervisor_state.hpp"
#include "actors/supervisor_steps.hpp"

#include <caf/actor_system.hpp>

namespace maxkernel::actors {

namespace {

void iterate(supervisor_self self);

// Evaluates one candidate as the next vertex of the trajectory, records it and goes on.
void run_lineage(supervisor_self self, lineage_start start) {
  auto run = self->state.run;
  auto l = std::make_shared<lineage<supervisor_impl>>(
    self, run->ctx, std::move(start), [self, run](std::string vertex, caf::error err) {
      if (!current(self, run))
        return;
      if (err)
        return abort_search(self, std::move(err));
      if (!record_vertex(self, vertex))
        return;
      auto r = run->record.vertex(run->record.size() - 1);
      run->step_ended();
      ++self->state.round;
      report(self, r.getCorrect()
                     ? fmt::format("vertex {} ({}): correct, {:.2f} us", r.getIndex(),
                                   r.getStrategy().cStr(), r.getTimeUs())
                     : fmt::format("vertex {} ({}): {}", r.getIndex(), r.getStrategy().cStr(),
                                   r.getFailureClass().cStr()));
      iterate(self);
    });
  // The bar of the tester's cases: the best when the iteration starts.
  run->ctx->set_cases_bar(run->record.best_time_us());
  if (record_vertex(self, l->pending_vertex()))
    l->run();
}

void iterate(supervisor_self self) {
  auto run = self->state.run;
  // A resumed search first finishes the candidate it was evaluating.
  for (size_t i = 0; i < run->record.size(); ++i)
    if (run->record.vertex(i).getState() == schema::VertexState::PENDING)
      return run_lineage(self, restart_of(run->record.vertex(i)));
  if (hold(self, [self] { iterate(self); }))
    return;
  if (auto reason = run->stop_reason(); !reason.empty())
    return finish(self, reason);
  // The planner moves from the best correct candidate (by its diagnosis) or, before there
  // is one, proposes templates; the first step that gives a new kernel comes next.
  next_in_chain(
    self, [self](lineage_start start) { run_lineage(self, std::move(start)); },
    [self](const std::string& text) { report(self, text); },
    [self] { finish(self, "exhausted"); },
    [self](caf::error err) { abort_search(self, std::move(err)); });
}

}  // namespace

messages::supervisor_actor spawn_auto_supervisor(caf::actor_system& sys,
                                                 messages::agent_pool pool,
                                                 messages::tpu_node_actor node,
                                                 messages::progress_listener_actor listener) {
  return sys.spawn(supervisor_behavior, std::move(pool), std::move(node), std::move(listener),
                   std::function<void(supervisor_self)>(iterate));
}

}  // namespace maxkernel::actors
