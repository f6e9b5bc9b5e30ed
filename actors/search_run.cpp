#include "actors/search_run.hpp"

#include <capnp/message.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace maxkernel::actors {

bool search_run::open(const std::string& request_bytes, std::string& error) {
  ctx->request = messages::decode<schema::OptimizeRequest>(request_bytes, error);
  if (!ctx->request) {
    error = "OptimizeRequest: " + error;
    return false;
  }
  ctx->request->allow_rereading();
  auto s = ctx->settings();
  if (s.getChip().size() == 0) {
    error = "OptimizeRequest.settings.chip is empty";
    return false;
  }
  // hitl ends when the operator says stop; the other modes need a rule.
  if (s.getMode() != "hitl" && s.getBudgetEvals() == 0 && s.getBudgetSeconds() <= 0 &&
      s.getPatience() == 0) {
    error = "the search has no end: give an evaluation budget, a time budget or a patience";
    return false;
  }
  std::string on_timeout = s.getOnTimeout().cStr();
  if (!on_timeout.empty() && on_timeout != "wait" && on_timeout != "approve" &&
      on_timeout != "stop") {
    error = "OptimizeRequest.settings.onTimeout is '" + on_timeout +
            "': wait, approve or stop";
    return false;
  }
  if (!std::isfinite(s.getOperatorTimeoutSeconds()) || s.getOperatorTimeoutSeconds() < 0) {
    error = "OptimizeRequest.settings.operatorTimeoutSeconds must be a number of seconds >= 0";
    return false;
  }
  auto spec = ctx->spec();
  if (!record.open(ctx->optimize().getGraphPath().cStr(), spec, s, ctx->optimize().getResume(),
                   error))
    return false;
  ctx->on_usage = [this](schema::Usage::Reader u) { record.add_usage(u); };
  best_us_ = record.best_time_us();
  return true;
}

std::string search_run::stop_reason() const {
  auto s = ctx->settings();
  if (stop_asked_)
    return "operator";
  if (budget_evals() > 0 && record.evaluated() >= budget_evals())
    return "budget";
  if (time_up())
    return "time";
  if (s.getPatience() > 0 && steps_without_gain_ >= s.getPatience())
    return "stagnation";
  int best = record.best();
  if (s.getTargetRoofline() > 0 && best >= 0) {
    auto v = record.vertex(static_cast<size_t>(best));
    if (v.getRooflineUs() > 0 && v.getRooflineUs() / v.getTimeUs() >= s.getTargetRoofline())
      return "roofline";
  }
  return "";
}

bool search_run::time_up() const {
  double budget = ctx->settings().getBudgetSeconds();
  double elapsed =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return budget > 0 && elapsed >= budget;
}

void search_run::step_ended() {
  double now = record.best_time_us();
  if (now > 0 && (best_us_ == 0 || now < best_us_)) {
    best_us_ = now;
    steps_without_gain_ = 0;
  } else {
    ++steps_without_gain_;
  }
}

unsigned search_run::remaining_budget() const {
  uint32_t cap = budget_evals();
  if (cap == 0)
    return std::numeric_limits<unsigned>::max();
  unsigned done = record.evaluated();
  return done >= cap ? 0 : cap - done;
}

unsigned search_run::round_budget() const {
  unsigned left = remaining_budget();
  return left == std::numeric_limits<unsigned>::max() ? left : left - left / 2;
}

uint32_t search_run::budget_evals() const {
  return budget_evals_ ? *budget_evals_ : ctx->settings().getBudgetEvals();
}

bool search_run::set_budget(uint32_t evals, std::string& error) {
  auto s = ctx->settings();
  if (evals == 0 && s.getMode() != "hitl" && s.getBudgetSeconds() <= 0 && s.getPatience() == 0) {
    error = "budget 0 (no cap) would leave this search without an end: it has no time budget "
            "and no patience";
    return false;
  }
  budget_evals_ = evals;
  return true;
}

std::string search_run::progress(const std::string& message, unsigned round) const {
  capnp::MallocMessageBuilder msg;
  auto p = msg.initRoot<schema::Progress>();
  auto& c = *ctx;  // shared_ptr: the context is not const here
  p.setEvaluations(record.evaluated());
  p.setBudgetEvals(budget_evals());
  p.setPaused(paused);
  double best = record.best_time_us();
  p.setBestTimeUs(best);
  double ref = c.optimize().getReferenceTimeUs();
  p.setBestSpeedup(best > 0 && ref > 0 ? ref / best : 0);
  p.setRound(round);
  p.setInFlight(c.in_flight);
  p.setMessage(message);
  return messages::encode(msg);
}

}  // namespace maxkernel::actors
