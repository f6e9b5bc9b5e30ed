#include "actors/supervisor_state.hpp"

#include "actors/supervisor_steps.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <algorithm>

namespace maxkernel::actors {

using messages::payload;

void report(supervisor_self self, const std::string& message) {
  auto& st = self->state;
  if (st.listener && st.run)
    self->send(st.listener, messages::progress_atom::value,
               payload{capnp::typeId<schema::Progress>(), st.run->progress(message, st.round)});
}

void finish(supervisor_self self, const std::string& reason) {
  auto& st = self->state;
  // The graph file holds the whole search before anyone reads the result (and copies it).
  std::string error;
  if (!st.run->record.flush(error))
    return abort_search(self, messages::make_error(messages::error_code::internal,
                                                   "search graph: " + error));
  report(self, "stopped: " + reason);
  st.promise.deliver(
    payload{capnp::typeId<schema::OptimizeResult>(), st.run->result(reason, st.round)});
  st.run.reset();
}

void abort_search(supervisor_self self, caf::error err) {
  auto& st = self->state;
  st.promise.deliver(std::move(err));
  st.run.reset();
}

bool record_vertex(supervisor_self self, const std::string& vertex_bytes) {
  std::string error;
  auto v = messages::decode<schema::Vertex>(vertex_bytes, error);
  if (!v || !self->state.run->record.put(v->root<schema::Vertex>(), error)) {
    abort_search(self, messages::make_error(messages::error_code::internal,
                                            "search graph: " + error));
    return false;
  }
  return true;
}

lineage_start restart_of(schema::Vertex::Reader v) {
  return {v.getIndex(),           v.getParent(),
          v.getRound(),           v.getStrategy().cStr(),
          v.getRationale().cStr(), messages::encode_root(v.getCandidate()),
          v.getExpectedEffect().cStr()};
}

void next_in_chain(supervisor_self self, std::function<void(lineage_start)> next,
                   std::function<void(const std::string&)> say, std::function<void()> exhausted,
                   std::function<void(caf::error)> fail) {
  auto run = self->state.run;
  ask_plan(
    self, *run, "", one_child_steps,
    [=](std::shared_ptr<messages::decoded_message> plan) {
      if (!current(self, run))
        return;
      auto p = plan->root<schema::Plan>();
      if (p.getSteps().size() == 0) {
        // "No template applies" and the like: whoever runs the search should read why.
        if (p.getMessage().size())
          say("planner: " + std::string(p.getMessage().cStr()));
        return exhausted();
      }
      auto taken = std::make_shared<std::vector<std::string>>();
      auto impl = std::make_shared<step_implementer<supervisor_impl>>(
        self, run, plan, taken, 1,
        [=](std::vector<implemented_step> found, std::vector<std::string> skipped) {
          if (!current(self, run))
            return;
          for (const auto& s : skipped)
            say(s);
          if (found.empty())
            return exhausted();
          auto& f = found.front();
          next({static_cast<unsigned>(run->record.size()), f.parent, self->state.round,
                f.strategy, f.rationale, f.candidate, f.expected_effect});
        });
      impl->start();
    },
    [=](caf::error err) {
      if (current(self, run))
        fail(std::move(err));
    });
}

bool hold(supervisor_self self, std::function<void()> go_on) {
  auto& run = *self->state.run;
  if (!run.paused || !run.stop_reason().empty())
    return false;
  self->state.parked = std::move(go_on);
  return true;
}

namespace {

caf::result<payload> control(supervisor_self self, const payload& request) {
  auto& st = self->state;
  if (!st.run)
    return messages::make_error(messages::error_code::bad_input, "no search is running");
  std::string error;
  auto msg = messages::open_payload<schema::SearchControl>(request, error);
  if (!msg)
    return messages::make_error(messages::error_code::malformed_message, "control: " + error);
  auto c = msg->root<schema::SearchControl>();
  auto& run = *st.run;
  std::string said;
  switch (c.which()) {
    case schema::SearchControl::STOP:
      run.request_stop();
      said = "the operator stopped the search";
      if (c.getStop().size())
        said += fmt::format(" ({})", c.getStop().cStr());
      said += st.parked ? "" : ": in-flight candidates finish first";
      break;
    case schema::SearchControl::PAUSE:
      run.paused = true;
      said = "the operator paused the search: in-flight candidates finish, no new step starts";
      break;
    case schema::SearchControl::RESUME:
      run.paused = false;
      said = "the operator resumed the search";
      break;
    case schema::SearchControl::BUDGET_EVALS:
      if (!run.set_budget(c.getBudgetEvals(), error))
        return messages::make_error(messages::error_code::bad_input, error);
      said = c.getBudgetEvals() == 0
               ? std::string("the operator lifted the candidate budget")
               : fmt::format("the operator set the budget to {} candidates ({} evaluated)",
                             c.getBudgetEvals(), run.record.evaluated());
      break;
    default:
      return messages::make_error(messages::error_code::malformed_message,
                                  "control: an action this supervisor does not know");
  }
  report(self, said);
  // Answered first: a parked step that goes on may end the search, and the operator's
  // answer should reach them before the search's own.
  auto rp = self->make_response_promise<payload>();
  rp.deliver(payload{capnp::typeId<schema::Progress>(), run.progress(said, st.round)});
  // A parked step goes on once nothing holds it (resumed, stopped, the budget spent).
  if (st.parked && (!run.paused || !run.stop_reason().empty())) {
    auto go_on = std::move(st.parked);
    st.parked = nullptr;
    go_on();
  }
  return rp;
}

}  // namespace

messages::supervisor_actor::behavior_type supervisor_behavior(
  supervisor_self self, messages::agent_pool pool, messages::tpu_node_actor node,
  messages::progress_listener_actor listener, std::function<void(supervisor_self)> next) {
  self->state.pool = std::move(pool);
  self->state.node = std::move(node);
  self->state.listener = std::move(listener);
  return {
    [self, next](messages::optimize_atom, const payload& request) -> caf::result<payload> {
      auto& st = self->state;
      if (st.run)
        return messages::make_error(messages::error_code::bad_input,
                                    "this supervisor is running a search already");
      if (request.type_id != capnp::typeId<schema::OptimizeRequest>())
        return messages::make_error(messages::error_code::malformed_message,
                                    "optimize: the payload is not an OptimizeRequest");
      auto run = std::make_shared<search_run>();
      std::string error;
      if (!run->open(request.bytes, error))
        return messages::make_error(messages::error_code::bad_input, error);
      run->ctx->pool = st.pool;
      run->ctx->node = st.node;
      st.run = run;
      // A resumed search goes on in the round it was killed in (its pending vertices), else
      // in the one after the last.
      st.round = 0;
      bool pending = false;
      for (size_t i = 0; i < run->record.size(); ++i) {
        auto v = run->record.vertex(i);
        if (v.getState() == schema::VertexState::PENDING) {
          st.round = pending ? std::min(st.round, v.getRound()) : v.getRound();
          pending = true;
        } else if (!pending) {
          st.round = std::max(st.round, v.getRound() + 1);
        }
      }
      st.parked = nullptr;
      st.promise = self->make_response_promise<payload>();
      ask_test_plan(
        self, run->ctx,
        [self, run, next] {
          if (current(self, run))
            next(self);
        },
        [self, run](caf::error err) {
          if (current(self, run))
            abort_search(self, std::move(err));
        });
      return st.promise;
    },
    [self](messages::control_atom, const payload& request) -> caf::result<payload> {
      return control(self, request);
    },
  };
}

}  // namespace maxkernel::actors
