// What the auto and graph supervisors share as actors: their state (handles, the search
// under way, the pending reply) and the steps every mode takes the same way: accepting an
// OptimizeRequest, reporting progress, recording a vertex, answering at the end. Each mode
// adds its own loop (`next`). Included only by the supervisors' .cpp files.
#pragma once

#include "actors/lineage.hpp"
#include "actors/search_run.hpp"
#include "messages/agent_pool.hpp"
#include "messages/operator_actor.hpp"
#include "messages/supervisor_actor.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <functional>
#include <memory>
#include <string>

namespace maxkernel::actors {

struct supervisor_state {
  messages::agent_pool pool;
  messages::tpu_node_actor node;
  messages::progress_listener_actor listener;
  std::shared_ptr<search_run> run;  // the search under way; null when idle
  caf::typed_response_promise<messages::payload> promise;
  unsigned round = 0;               // auto: iteration; graph: round
  messages::operator_actor op;      // hitl: the operator gateway
  std::function<void()> parked;     // the next step of a paused search
  static inline const char* name = "supervisor";
};

using supervisor_self = messages::supervisor_actor::stateful_pointer<supervisor_state>;
using supervisor_impl = std::remove_pointer_t<supervisor_self>;

// The behavior of a supervisor whose mode loop is `next` (called once the tester's plan is
// in, and by the mode itself after each step).
messages::supervisor_actor::behavior_type supervisor_behavior(
  supervisor_self self, messages::agent_pool pool, messages::tpu_node_actor node,
  messages::progress_listener_actor listener, std::function<void(supervisor_self)> next);

void report(supervisor_self self, const std::string& message);
// Answers the OptimizeRequest with the whole search and goes idle.
void finish(supervisor_self self, const std::string& reason);
// Answers with an infrastructure error (a node or role that cannot answer) and goes idle.
void abort_search(supervisor_self self, caf::error err);
// Writes a vertex through to the record (and its graph file); false after aborting.
bool record_vertex(supervisor_self self, const std::string& vertex_bytes);
// A pending vertex as the lineage that evaluates it again (a resumed search).
lineage_start restart_of(schema::Vertex::Reader v);

// auto's and hitl's next step: a Plan from the best accepted vertex (8 steps asked: a step
// whose kernel is already in the graph is skipped) and the first step that gives a new
// kernel, handed to `next` as the next vertex's lineage. `say` gets the planner's reason
// when it has no steps and each skipped step; `exhausted` is called when nothing new came,
// `fail` with an infrastructure error. Answers that come after the search ended are dropped.
void next_in_chain(supervisor_self self, std::function<void(lineage_start)> next,
                   std::function<void(const std::string&)> say, std::function<void()> exhausted,
                   std::function<void(caf::error)> fail);

// Whether the search is paused (SearchControl): parks `go_on` to be called on resume or stop
// and returns true. Each mode asks this before starting a step.
bool hold(supervisor_self self, std::function<void()> go_on);

// Whether `run` is still the search under way (answers of an ended search are dropped).
inline bool current(supervisor_self self, const std::shared_ptr<search_run>& run) {
  return self->state.run == run;
}

}  // namespace maxkernel::actors
