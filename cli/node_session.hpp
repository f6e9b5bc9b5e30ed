// One node process in miniature for a CLI command: an actor system, the evaluation store, a
// worker pool of one JAX worker and a tpu_node in front of it. Commands talk to the node
// through its typed interface, as a supervisor would; the node answers repeats from the store.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "messages/dispatcher_actor.hpp"
#include "messages/tpu_node_actor.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace caf {
class actor_system;
}

namespace maxkernel::cli {

struct session_options {
  std::string chip;                 // the node's chip
  std::string state_dir;            // "" = search::default_state_dir()
  bool use_store = true;
  uint64_t memory_limit_bytes = 8ull << 30;
  std::chrono::milliseconds deadline{600'000};
  // Model backend: simulated device time per evaluation (capacity planning); results stay
  // the model's.
  std::chrono::milliseconds simulate_device{0};
  // TPU nodes (simulated devices on the model backend) sharing one worker pool of
  // `workers` JAX workers (0: one per core). With more than one node, or `dispatch`, a
  // dispatcher stands in front of them (cluster/dispatcher.hpp).
  unsigned nodes = 1;
  unsigned workers = 1;
  bool dispatch = false;
};

struct session_answer {
  int exit_code = 0;                // 0, or 2 (bad input) / 3 (environment) when not ok
  std::string bytes;                // the reply's payload (EvalResult, KernelSpec)
  std::string error;
};

class node_session {
public:
  explicit node_session(session_options opts);
  ~node_session();
  node_session(const node_session&) = delete;
  node_session& operator=(const node_session&) = delete;

  // Starts everything and waits for the worker; false with `error` (exit code 3).
  bool start(std::string& error);
  session_answer evaluate(const std::string& request);  // EvalRequest -> EvalResult
  session_answer load_task(const std::string& path);    // task directory -> KernelSpec
  session_answer analyze(const std::string& request);   // AnalyzeRequest -> DataflowGraph
  // The session's actor system, for spawning the agent pool beside the node.
  caf::actor_system& system();
  // Where evaluations go: the dispatcher in front of the nodes, or the one node.
  messages::tpu_node_actor evaluator();
  // The dispatcher (for its status: nodes busy); invalid with one node and no `dispatch`.
  messages::dispatcher_actor dispatcher();
  unsigned nodes() const { return opts_.nodes; }
  unsigned workers() const { return workers_; }

  const std::string& backend() const { return backend_; }
  const std::string& jax_version() const { return jax_version_; }
  const std::string& store_path() const { return store_path_; }

private:
  struct impl;
  std::unique_ptr<impl> impl_;
  session_options opts_;
  std::string backend_;
  std::string jax_version_;
  std::string store_path_;
  unsigned workers_ = 1;
};

}  // namespace maxkernel::cli
