// Stand-ins for the planner and the implementer, made for bench_search only. The expert
// planner runs out of moves on a real spec after a few dozen candidates, and an LLM is out of
// reach and far too slow for a benchmark of the search machinery; these two derive thousands
// of distinct candidates deterministically and at almost no cost, so that what the benchmark
// measures is the supervisor, the dispatcher and the nodes, not the brains.
//
// Variant n of the base kernel is its source with one line appended (`_BENCH_VARIANT = n`):
// Python runs the same kernel, but the source (so the candidate id and the evaluation key)
// is new. The planner numbers the steps it hands out 0, 1, 2, ... in the order it is asked
// (the graph supervisor asks in a fixed order, so the numbering is deterministic) and has no
// more steps once it reaches `limit` (bench_search fills the store for variants below it).
#pragma once

#include "messages/implementer_actor.hpp"
#include "messages/planner_actor.hpp"
#include "messages/supervisor_actor.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace caf {
class actor_system;
}

namespace maxkernel::search_bench {

std::string variant_source(const std::string& base, uint64_t n);

// Reads only parentId and maxSteps of a PlannerRequest (without walking its history).
messages::planner_actor spawn_bench_planner(caf::actor_system& sys, uint64_t limit);
// Renders variant n (the step's `variant` change) of `base` as the step's Candidate.
messages::implementer_actor spawn_bench_implementer(caf::actor_system& sys, std::string base);
// The progress listener `maxkernel optimize` has (its progress line), reduced to counting.
messages::progress_listener_actor spawn_progress_counter(caf::actor_system& sys,
                                                         std::shared_ptr<std::atomic<uint64_t>> count);

}  // namespace maxkernel::search_bench
