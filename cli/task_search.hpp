// One task's search over a running node session and agent pool: what `optimize` runs once and
// `bench` runs for every task of a suite. Preparing it (the chip, the reference's analysis, the
// reference's and baseline's times, the OptimizeRequest), starting the mode's supervisor, and
// waiting for its OptimizeResult.
#pragma once

#include "cli/node_evaluation.hpp"
#include "cli/optimize_command.hpp"
#include "cli/optimize_outputs.hpp"
#include "cli/search_controls.hpp"
#include "messages/agent_pool.hpp"
#include "messages/operator_actor.hpp"
#include "messages/supervisor_actor.hpp"

#include <capnp/message.h>

#include <memory>
#include <optional>
#include <string>

namespace maxkernel::cli {

struct prepared_search {
  std::string chip;
  reference_times times;
  std::optional<messages::decoded_message> analysis;  // the reference's DataflowGraph
  std::unique_ptr<capnp::MallocMessageBuilder> request = std::make_unique<capnp::MallocMessageBuilder>();
  std::string graph_path;  // the search graph database (beside the evaluation store)
};

// 0, or the exit code (2 bad input: the chip; 3 environment: the analysis) and `error`.
int prepare_search(node_session& session, schema::KernelSpec::Reader spec,
                   const optimize_options& opts, const std::string& state_dir,
                   prepared_search& out, std::string& error);

// Controls `supervisor`'s running search (waits at most a few seconds for its answer).
search_controller controller_of(caf::actor_system& sys, messages::supervisor_actor supervisor);

// The supervisor of `mode` (auto | graph | hitl; hitl needs `op`).
messages::supervisor_actor spawn_supervisor(caf::actor_system& sys, const std::string& mode,
                                            const messages::agent_pool& pool,
                                            messages::tpu_node_actor evaluator,
                                            messages::progress_listener_actor listener,
                                            messages::operator_actor op);

struct search_reply {
  int exit_code = 0;  // 0, else the exit code of the supervisor's error and `error`
  std::string error;
  std::optional<messages::decoded_message> result;  // OptimizeResult, readable many times
  schema::OptimizeResult::Reader root() { return result->root<schema::OptimizeResult>(); }
};

// Sends the request and waits for the supervisor's answer.
search_reply await_search(caf::actor_system& sys, const messages::supervisor_actor& supervisor,
                          prepared_search& prepared);

// What result.json needs besides the result.
optimize_outcome outcome_of(const prepared_search& prepared, const optimize_options& opts,
                            node_session& session, double wall_seconds);

}  // namespace maxkernel::cli
