// The requests both supervisors make of the pool around the lineages: the tester's plan for
// the task, a Plan (from the best candidate, or from a named vertex for the graph search)
// and the implementer's candidates for a plan's steps. Asynchronous requests of the
// supervisor actor; answers come back through callbacks. Included only by supervisors' .cpp.
#pragma once

#include "actors/search_record.hpp"
#include "actors/search_run.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <caf/error.hpp>
#include <fmt/format.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace maxkernel::actors {

// A step the implementer turned into a candidate the graph does not hold yet.
struct implemented_step {
  std::string candidate;   // Candidate bytes
  int parent = -1;         // vertex index
  std::string strategy;
  std::string rationale;
  std::string expected_effect;
  std::string signature;   // the plan step's kind of change ("" when the brain gave none)
};

// TesterRequest -> the run's TestPlan (ctx->plan), then `next`; an error to `fail`.
template <class Self>
void ask_test_plan(Self* self, std::shared_ptr<search_context> ctx, std::function<void()> next,
                   std::function<void(caf::error)> fail) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::TesterRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.setSpec(ctx->spec());
  req.setAnalysis(ctx->analysis());
  req.setChip(ctx->chip());
  req.setSeed(ctx->settings().getSeed());
  self->request(ctx->pool.tester, ctx->role_timeout(), messages::testplan_atom::value,
                messages::make_payload<schema::TesterRequest>(msg))
    .then(
      [ctx, next, fail](messages::payload& reply) {
        std::string error;
        ctx->plan = messages::open_payload<schema::TestPlan>(reply, error);
        if (!ctx->plan)
          return fail(messages::make_error(messages::error_code::malformed_message,
                                           "TestPlan: " + error));
        ctx->plan->allow_rereading();
        next();
      },
      [fail](caf::error& err) { fail(std::move(err)); });
}

// Steps asked of the planner when one child is wanted (auto's next candidate, graph's dive):
// the first that makes a kernel not evaluated yet is taken.
inline constexpr unsigned one_child_steps = 8;

// PlannerRequest with the whole history -> the Plan (decoded), or an error.
template <class Self>
void ask_plan(Self* self, search_run& run, const std::string& parent_id, unsigned max_steps,
              std::function<void(std::shared_ptr<messages::decoded_message>)> next,
              std::function<void(caf::error)> fail) {
  auto ctx = run.ctx;
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::PlannerRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.setSpec(ctx->spec());
  req.setAnalysis(ctx->analysis());
  run.record.fill_history(req, parent_id);
  req.setChip(ctx->chip());
  req.setMaxSteps(max_steps);
  req.setSeed(ctx->settings().getSeed());
  req.setParentId(parent_id);
  self->request(ctx->pool.planner, ctx->role_timeout(), messages::plan_atom::value,
                messages::make_payload<schema::PlannerRequest>(msg))
    .then(
      [ctx, next, fail](messages::payload& reply) {
        std::string error;
        auto plan = messages::open_payload<schema::Plan>(reply, error);
        if (!plan)
          return fail(messages::make_error(messages::error_code::malformed_message,
                                           "Plan: " + error));
        plan->allow_rereading();
        ctx->usage(plan->root<schema::Plan>().getUsage());
        next(std::make_shared<messages::decoded_message>(std::move(*plan)));
      },
      [fail](caf::error& err) { fail(std::move(err)); });
}

// Implements steps [first, end) of `plan` one after another (in step order: the outcome does
// not depend on reply timing) and hands over those that give a candidate new to the graph
// and to `taken` (ids already chosen this round). A step the implementer cannot do is
// skipped with its reason in `skipped`. Stops early once `want` candidates are found.
template <class Self>
class step_implementer : public std::enable_shared_from_this<step_implementer<Self>> {
public:
  using done_fn = std::function<void(std::vector<implemented_step>, std::vector<std::string>)>;

  step_implementer(Self* self, std::shared_ptr<search_run> run,
                   std::shared_ptr<messages::decoded_message> plan,
                   std::shared_ptr<std::vector<std::string>> taken, unsigned want, done_fn done)
    : self_(self), run_(std::move(run)), plan_(std::move(plan)), taken_(taken), want_(want),
      done_(std::move(done)) {}

  void start() { next(0); }

private:
  void next(unsigned i) {
    auto steps = plan_->root<schema::Plan>().getSteps();
    if (i >= steps.size() || found_.size() >= want_)
      return done_(std::move(found_), std::move(skipped_));
    auto step = steps[i];
    auto ctx = run_->ctx;
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::ImplementRequest>();
    req.setSchemaVersion(schema::SCHEMA_VERSION);
    req.setSpec(ctx->spec());
    req.setAnalysis(ctx->analysis());
    req.setStep(step);
    req.setChip(ctx->chip());
    int parent = step.getParentId().size() ? run_->record.find_candidate(step.getParentId().cStr())
                                           : -1;
    if (parent >= 0) {
      req.setParent(run_->record.vertex(static_cast<size_t>(parent)).getCandidate());
      req.setHasParent(true);
    }
    auto me = this->shared_from_this();
    self_->request(ctx->pool.implementer, ctx->role_timeout(), messages::implement_atom::value,
                   messages::make_payload<schema::ImplementRequest>(msg))
      .then(
        [me, i, parent](messages::payload& reply) {
          std::string error;
          auto rep = messages::open_payload<schema::ImplementReply>(reply, error);
          if (!rep) {
            me->skipped_.push_back("implementer: " + error);
            return me->next(i + 1);
          }
          auto r = rep->root<schema::ImplementReply>();
          me->run_->ctx->usage(r.getUsage());
          auto c = r.getCandidate();
          std::string id = c.getId().cStr();
          int in_graph = me->run_->record.find_tried(id);
          bool taken = false;
          for (const auto& t : *me->taken_)
            taken = taken || t == id;
          auto step = me->plan_->template root<schema::Plan>().getSteps()[i];
          if (in_graph >= 0) {
            me->skipped_.push_back(fmt::format("{}: the same kernel as vertex {}",
                                               step.getMove().cStr(), in_graph));
          } else if (taken) {
            me->skipped_.push_back(fmt::format("{}: the same kernel as another step of this round",
                                               step.getMove().cStr()));
          } else {
            me->taken_->push_back(id);
            std::string strategy = c.getStrategy().size() ? c.getStrategy().cStr()
                                                           : step.getMove().cStr();
            me->found_.push_back({messages::encode_root(c), parent, strategy,
                                  step.getRationale().cStr(), step.getExpectedEffect().cStr(),
                                  step.getSignature().cStr()});
          }
          me->next(i + 1);
        },
        [me, i](caf::error& err) {
          me->skipped_.push_back("implementer: " + messages::message_of(err));
          me->next(i + 1);
        });
  }

  Self* self_;
  std::shared_ptr<search_run> run_;
  std::shared_ptr<messages::decoded_message> plan_;
  std::shared_ptr<std::vector<std::string>> taken_;
  unsigned want_;
  done_fn done_;
  std::vector<implemented_step> found_;
  std::vector<std::string> skipped_;
};

}  // namespace maxkernel::actors
