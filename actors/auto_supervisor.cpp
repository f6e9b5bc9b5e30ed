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
  if (record_vertex(self, l->pending_vertex()))
    l->run();
}

void iterate(supervisor_self self) {
  auto run = self->state.run;
  // A resumed search first finishes the candidate it was evaluating.
  for (size_t i = 0; i < run->record.size(); ++i) {
    auto v = run->record.vertex(i);
    if (v.getState() == schema::VertexState::PENDING)
      return run_lineage(self, {v.getIndex(), v.getParent(), v.getRound(), v.getStrategy().cStr(),
                                v.getRationale().cStr(), messages::encode_root(v.getCandidate())});
  }
  if (auto reason = run->stop_reason(); !reason.empty())
    return finish(self, reason);
  auto fail = [self, run](caf::error err) {
    if (current(self, run))
      abort_search(self, std::move(err));
  };
  // The planner moves from the best correct candidate (by its diagnosis) or, before there
  // is one, proposes templates; the first step that gives a new kernel comes next.
  // More steps than the one taken: a step whose kernel is already in the graph is skipped.
  ask_plan(self, *run, "", 8,
    [self, run](std::shared_ptr<messages::decoded_message> plan) {
      if (!current(self, run))
        return;
      auto p = plan->root<schema::Plan>();
      if (p.getSteps().size() == 0) {
        // "No template applies" and the like: the operator of the command should read why.
        if (p.getMessage().size())
          report(self, "planner: " + std::string(p.getMessage().cStr()));
        return finish(self, "exhausted");
      }
      auto taken = std::make_shared<std::vector<std::string>>();
      auto impl = std::make_shared<step_implementer<supervisor_impl>>(
        self, run, plan, taken, 1,
        [self, run](std::vector<implemented_step> found, std::vector<std::string> skipped) {
          if (!current(self, run))
            return;
          for (const auto& s : skipped)
            report(self, s);
          if (found.empty())
            return finish(self, "exhausted");
          auto& f = found.front();
          run_lineage(self, {static_cast<unsigned>(run->record.size()), f.parent,
                             self->state.round, f.strategy, f.rationale, f.candidate});
        });
      impl->start();
    },
    fail);
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
