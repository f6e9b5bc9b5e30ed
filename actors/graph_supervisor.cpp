#include "actors/graph_supervisor.hpp"

#include "actors/lineage.hpp"
#include "actors/supervisor_state.hpp"
#include "actors/supervisor_steps.hpp"
#include "search/selection_policy.hpp"

#include <caf/actor_system.hpp>

#include <algorithm>
#include <set>

namespace maxkernel::actors {

namespace {

void next_round(supervisor_self self);

// The best correct time among the vertices before `first` (0: none): the bar of the tester's
// cases for a round whose children start at `first`. Not the record's best: a round resumed
// after a time budget cut it holds some of its own children already, and those must not set
// the bar of their siblings (a sibling as fast, skipped, would win the tie as the earlier).
double best_before(const search_record& record, size_t first) {
  double best = 0;
  for (size_t i = 0; i < std::min(first, record.size()); ++i) {
    auto v = record.vertex(i);
    if (v.getState() == schema::VertexState::EVALUATED && v.getCorrect() && v.getTimeUs() > 0 &&
        accepted(v) && (best == 0 || v.getTimeUs() < best))
      best = v.getTimeUs();
  }
  return best;
}

// What a round expands: its parents (in selection order; -1: the planner without a parent,
// first candidates) and how many children it asks of the planner and takes from each.
struct round_shape {
  std::vector<int> parents;
  unsigned steps = 0;   // the planner's max_steps per parent
  unsigned take = 0;    // children kept per parent
};

// The vertex a dive starts from, or -1. When the last round made the best vertex (it was
// faster than everything before) and that vertex is still open, the next round is one
// child of it, the planner's first new move: on a chain of improving moves breadth would
// pay `branching` children per step where one finds the next. The rule reads only the
// record, so a resumed search and any node count make the same rounds.
int dive_parent(const search_record& record) {
  int best = record.best();
  if (best < 0 || record.vertex(static_cast<size_t>(best)).getExhausted())
    return -1;
  unsigned last = 0;
  for (size_t i = 0; i < record.size(); ++i)
    last = std::max(last, record.vertex(i).getRound());
  return record.vertex(static_cast<size_t>(best)).getRound() == last ? best : -1;
}

// Dispatches the round's lineages (vertices `first` .. end, already recorded as pending) all
// at once; when the last one is in, records them in vertex order and starts the next round.
void dispatch_round(supervisor_self self, std::vector<lineage_start> children) {
  auto run = self->state.run;
  auto slots = std::make_shared<std::vector<std::string>>(children.size());
  auto left = std::make_shared<size_t>(children.size());
  report(self, fmt::format("round {}: {} candidate(s) out", self->state.round, children.size()));
  // The bar of the tester's cases: the best when the round starts, fixed before dispatch.
  size_t first = children.empty() ? run->record.size() : children.front().index;
  for (auto& c : children)
    first = std::min<size_t>(first, c.index);
  run->ctx->set_cases_bar(best_before(run->record, first));
  std::vector<std::shared_ptr<lineage<supervisor_impl>>> lineages;
  for (size_t k = 0; k < children.size(); ++k) {
    lineages.push_back(std::make_shared<lineage<supervisor_impl>>(
      self, run->ctx, std::move(children[k]),
      [self, run, slots, left, k](std::string vertex, caf::error err) {
        if (!current(self, run))
          return;
        if (err)
          return abort_search(self, std::move(err));
        (*slots)[k] = std::move(vertex);
        if (--*left > 0 && run->time_up()) {
          // The time budget does not wait for the round's stragglers: what is in is recorded,
          // the rest stays pending in the graph (a resumed search evaluates it).
          std::vector<std::string> done;
          for (auto& v : *slots)
            if (!v.empty())
              done.push_back(std::move(v));
          std::string error;
          if (!run->record.put_all(done, error))
            return abort_search(self, messages::make_error(messages::error_code::internal,
                                                           "search graph: " + error));
          return finish(self, "time");
        }
        if (*left > 0) {
          report(self, fmt::format("round {}: {} of {} candidate(s) in", self->state.round,
                                   slots->size() - *left, slots->size()));
          return;
        }
        // Every answer is in: the round is recorded in vertex order, whatever the arrival.
        std::string error;
        if (!run->record.put_all(*slots, error))
          return abort_search(self, messages::make_error(messages::error_code::internal,
                                                         "search graph: " + error));
        run->step_ended();
        int best = run->record.best();
        report(self, best < 0 ? fmt::format("round {} done: nothing correct yet",
                                            self->state.round)
                              : fmt::format("round {} done: best vertex {} at {:.2f} us",
                                            self->state.round, best, run->record.best_time_us()));
        ++self->state.round;
        next_round(self);
      }));
  }
  // The round's children are recorded together: a search killed now resumes with all of them.
  std::vector<std::string> pending;
  for (auto& l : lineages)
    pending.push_back(l->pending_vertex());
  std::string error;
  if (!run->record.put_all(pending, error))
    return abort_search(self, messages::make_error(messages::error_code::internal,
                                                   "search graph: " + error));
  for (auto& l : lineages)
    l->run();
}

// The round's children from `plans` (one per expanded vertex, in selection order), each
// implemented in step order; then truncated to the round's share of the budget and dispatched.
void implement_round(supervisor_self self, std::shared_ptr<const round_shape> shape,
                     std::vector<std::shared_ptr<messages::decoded_message>> plans, size_t at,
                     std::shared_ptr<std::vector<implemented_step>> children,
                     std::shared_ptr<std::vector<std::string>> taken) {
  auto run = self->state.run;
  if (at == plans.size()) {
    // One child per kind of change in a round: the same change from a second parent waits
    // for the first one's result (the planner, seeing it, ranks the change again next round)
    // instead of spending the round's budget on it blind.
    std::set<std::string> kinds;
    size_t deferred = 0;
    std::vector<implemented_step> distinct;
    for (auto& c : *children) {
      if (!c.signature.empty() && !kinds.insert(c.signature).second) {
        ++deferred;
        continue;
      }
      distinct.push_back(std::move(c));
    }
    *children = std::move(distinct);
    if (deferred)
      report(self, fmt::format("round {}: {} repeat(s) of a change already in the round "
                               "deferred", self->state.round, deferred));
    size_t budget = run->round_budget();
    if (children->size() > budget)
      children->resize(budget);
    if (children->empty() && shape->parents.front() >= 0) {
      // Every vertex expanded had no new move and is marked exhausted now: the selection
      // runs again over the vertices still open (after a dive: a round of breadth). Each
      // pass closes at least one vertex, so this ends.
      report(self, fmt::format("round {}: no new move from {} vertex(es); selecting again",
                               self->state.round, shape->parents.size()));
      return next_round(self);
    }
    if (children->empty())
      return finish(self, "exhausted");
    std::vector<lineage_start> starts;
    for (auto& c : *children)
      starts.push_back({static_cast<unsigned>(run->record.size() + starts.size()), c.parent,
                        self->state.round, c.strategy, c.rationale, c.candidate,
                        c.expected_effect});
    return dispatch_round(self, std::move(starts));
  }
  auto impl = std::make_shared<step_implementer<supervisor_impl>>(
    self, run, plans[at], taken, shape->take,
    [self, run, shape, plans, at, children, taken](std::vector<implemented_step> found,
                                                  std::vector<std::string>) {
      if (!current(self, run))
        return;
      auto& parents = shape->parents;
      std::string error;
      if (found.empty() && parents[at] >= 0 &&
          !run->record.mark_exhausted(static_cast<size_t>(parents[at]), error))
        return abort_search(self, messages::make_error(messages::error_code::internal,
                                                       "search graph: " + error));
      for (auto& f : found)
        children->push_back(std::move(f));
      implement_round(self, shape, plans, at + 1, children, taken);
    });
  impl->start();
}

// Asks the planner for each selected vertex in turn (the order is the selection's).
void plan_round(supervisor_self self, std::shared_ptr<const round_shape> shape,
                std::shared_ptr<std::vector<std::shared_ptr<messages::decoded_message>>> plans) {
  auto run = self->state.run;
  if (plans->size() == shape->parents.size())
    return implement_round(self, shape, *plans, 0,
                           std::make_shared<std::vector<implemented_step>>(),
                           std::make_shared<std::vector<std::string>>());
  int parent = shape->parents[plans->size()];
  std::string parent_id;
  if (parent >= 0)
    parent_id = run->record.vertex(static_cast<size_t>(parent)).getCandidate().getId().cStr();
  ask_plan(
    self, *run, parent_id, shape->steps,
    [self, run, shape, plans](std::shared_ptr<messages::decoded_message> plan) {
      if (!current(self, run))
        return;
      plans->push_back(std::move(plan));
      plan_round(self, shape, plans);
    },
    [self, run](caf::error err) {
      if (current(self, run))
        abort_search(self, std::move(err));
    });
}

void next_round(supervisor_self self) {
  auto& st = self->state;
  auto run = st.run;
  auto& record = run->record;
  // A resumed search first finishes the round it was in (its children were fixed).
  std::vector<lineage_start> pending;
  for (size_t i = 0; i < record.size(); ++i)
    if (record.vertex(i).getState() == schema::VertexState::PENDING)
      pending.push_back(restart_of(record.vertex(i)));
  if (!pending.empty())
    return dispatch_round(self, std::move(pending));
  if (hold(self, [self] { next_round(self); }))
    return;
  if (auto reason = run->stop_reason(); !reason.empty())
    return finish(self, reason);
  auto s = run->ctx->settings();
  auto shape = std::make_shared<round_shape>();
  if (int dive = s.getDive() ? dive_parent(record) : -1; dive >= 0) {
    *shape = {{dive}, one_child_steps, 1};
    return plan_round(self, std::move(shape),
                      std::make_shared<std::vector<std::shared_ptr<messages::decoded_message>>>());
  }
  // The frontier: correct, profiled vertices (one open per kernel: select_frontier).
  std::vector<search::frontier_entry> frontier;
  std::vector<uint32_t> children(record.size(), 0), depth(record.size(), 0);
  for (size_t i = 0; i < record.size(); ++i) {
    auto v = record.vertex(i);
    if (v.getParent() >= 0 && static_cast<size_t>(v.getParent()) < record.size()) {
      ++children[static_cast<size_t>(v.getParent())];
      depth[i] = depth[static_cast<size_t>(v.getParent())] + 1;
    }
  }
  for (size_t i = 0; i < record.size(); ++i) {
    auto v = record.vertex(i);
    if (v.getState() != schema::VertexState::EVALUATED || !v.getCorrect() || v.getTimeUs() <= 0)
      continue;
    frontier.push_back({static_cast<uint32_t>(i), v.getTimeUs(),
                        v.getCandidate().getTemplate().cStr(), children[i], depth[i],
                        v.getExhausted(), record.kernel_fingerprint(i)});
  }
  auto policy = search::parse_policy(s.getPolicy().cStr()).value_or(search::policy_kind::beam);
  unsigned width = std::max(1u, s.getBeamWidth());
  for (auto i : search::select_frontier(policy, frontier, width, st.round, s.getSeed()))
    shape->parents.push_back(static_cast<int>(i));
  shape->steps = shape->take = s.getBranching();
  // Before anything is correct (or once every correct vertex is exhausted) the planner is
  // asked without a parent: first candidates from the templates not tried yet, every one it
  // proposes.
  if (shape->parents.empty()) {
    shape->parents.push_back(-1);
    shape->steps = shape->take = width * s.getBranching();
  }
  plan_round(self, std::move(shape),
             std::make_shared<std::vector<std::shared_ptr<messages::decoded_message>>>());
}

}  // namespace

messages::supervisor_actor spawn_graph_supervisor(caf::actor_system& sys,
                                                  messages::agent_pool pool,
                                                  messages::tpu_node_actor node,
                                                  messages::progress_listener_actor listener) {
  return sys.spawn(supervisor_behavior, std::move(pool), std::move(node), std::move(listener),
                   std::function<void(supervisor_self)>(next_round));
}

}  // namespace maxkernel::actors
