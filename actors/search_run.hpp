// The part of a search both supervisors share outside the lineages: opening it (the graph
// file, a resumed search's vertices), the stop rules (budget, wall time, stagnation, target
// fraction of roofline), the progress line, and the final OptimizeResult. CAF-free.
#pragma once

#include "actors/search_context.hpp"
#include "actors/search_record.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace maxkernel::actors {

class search_run {
public:
  search_run() : ctx(std::make_shared<search_context>()) {}

  // Decodes the OptimizeRequest and opens its graph; false with `error` (bad input).
  bool open(const std::string& request_bytes, std::string& error);

  // Why the search stops now, or "" to go on. `progressed`: a candidate or round just ended
  // (stagnation counts those without a faster correct candidate).
  std::string stop_reason() const;
  // Whether the wall-time budget is spent (a graph round stops waiting for its stragglers).
  bool time_up() const;
  // Records that one step (an auto iteration, a graph round) ended: stagnation bookkeeping.
  void step_ended();
  // Candidates the budget still allows (UINT32_MAX without a cap).
  unsigned remaining_budget() const;
  // The candidates one graph round may take: half of what the budget leaves, rounded up (all
  // of it without a cap). A capped search so keeps evaluations to refine what its earlier
  // rounds found instead of spending them all on one breadth-first round. Depends on the
  // budget and the finished vertices only, never on nodes or timing.
  unsigned round_budget() const;
  // The cap on candidates (0: none): the request's, or the operator's change of it.
  uint32_t budget_evals() const;

  // An operator's controls (SearchControl). A stop ends the search at its next step boundary
  // (reason "operator"); a new budget must leave the search an end rule.
  void request_stop() { stop_asked_ = true; }
  bool set_budget(uint32_t evals, std::string& error);
  bool paused = false;  // no new step starts; the supervisor parks its next one

  // A Progress message for the listener.
  std::string progress(const std::string& message, unsigned round) const;
  std::string result(const std::string& stop_reason, unsigned rounds) const {
    return record.result_bytes(stop_reason, rounds);
  }

  std::shared_ptr<search_context> ctx;
  search_record record;

private:
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  double best_us_ = 0;
  unsigned steps_without_gain_ = 0;
  bool stop_asked_ = false;
  std::optional<uint32_t> budget_evals_;
};

}  // namespace maxkernel::actors
