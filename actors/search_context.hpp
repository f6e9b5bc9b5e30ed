// What every lineage of one search reads: the request (spec, analysis, settings), the
// tester's plan, the pool's and the node's handles; and what they add up: evaluation
// requests in flight, the brains' usage. Owned by the supervisor, shared with its lineages.
#pragma once

#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "messages/agent_pool.hpp"
#include "messages/capnp_io.hpp"
#include "messages/tpu_node_actor.hpp"

#include <caf/duration.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace maxkernel::actors {

struct search_context {
  messages::agent_pool pool;
  messages::tpu_node_actor node;  // one node or the dispatcher in front of all of them
  std::optional<messages::decoded_message> request;    // OptimizeRequest
  std::optional<messages::decoded_message> plan;       // the tester's TestPlan
  unsigned in_flight = 0;                              // evaluation requests out
  // The tester's cases go only to a candidate faster than this (us), one that could become
  // the result; a slower one is correct on the node's test alone. Set by the supervisor from
  // the best time when a step starts (auto: the iteration, graph: the round, hitl: the
  // step), before anything is dispatched: which candidates get the cases depends on spec,
  // seed and budget, not on node count or arrival order. 0: no bar (nothing correct yet, or
  // settings.testEveryCandidate), every candidate gets every case.
  double cases_bar_us = 0;
  std::function<void(schema::Usage::Reader)> on_usage; // the brains' tokens and cost

  schema::OptimizeRequest::Reader optimize() { return request->root<schema::OptimizeRequest>(); }
  schema::KernelSpec::Reader spec() { return optimize().getSpec(); }
  schema::DataflowGraph::Reader analysis() { return optimize().getAnalysis(); }
  schema::SearchSettings::Reader settings() { return optimize().getSettings(); }
  std::string chip() { return settings().getChip().cStr(); }
  std::string store_scope() { return settings().getStoreScope().cStr(); }
  schema::TestPlan::Reader test_plan() { return plan->root<schema::TestPlan>(); }
  // The bar of a step that starts with `best_us` the best correct time (0: none).
  void set_cases_bar(double best_us) {
    cases_bar_us = settings().getTestEveryCandidate() || !(best_us > 0) ? 0 : best_us;
  }
  void usage(schema::Usage::Reader u) {
    if (on_usage)
      on_usage(u);
  }

  uint32_t deadline_ms() { return settings().getDeadlineMs(); }
  // The node enforces the deadline; the margin only guards against a node that vanished.
  caf::duration eval_timeout() {
    auto ms = deadline_ms() ? deadline_ms() : 600'000u;
    return caf::duration{std::chrono::milliseconds(ms) + std::chrono::seconds(60)};
  }
  // An LLM brain may take minutes (retries with backoff) on one request.
  caf::duration role_timeout() { return caf::duration{std::chrono::minutes(15)}; }
};

}  // namespace maxkernel::actors
