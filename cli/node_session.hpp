// One node process in miniature for a CLI command: an actor system, the evaluation store, a
// worker pool of one JAX worker and a tpu_node in front of it. Commands talk to the node
// through its typed interface, as a supervisor would; the node answers repeats from the store.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "messages/dispatcher_actor.hpp"
#include "messages/tpu_node_actor.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace caf {
class actor_system;
}

namespace maxkernel::cli {

struct session_options {
  std::string chip;                 // the node's chip
  std::string backend;              // model | jax-tpu; "": jax-tpu when this host has TPUs
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
  // A cluster's processes (docs/cluster.md). supervisor: no nodes of its own; a dispatcher
  // that waits for remote nodes is published on `listen`, with the store in front of it.
  // node: `nodes` devices and their worker pool, no store (the supervisor keeps it) unless
  // `state_dir` names a host-local one that answers repeats; they
  // join a supervisor's dispatcher (cli/node_command). Both load CAF's middleman with
  // heartbeats, so a frozen peer is noticed.
  enum class cluster_role { none, supervisor, node } role = cluster_role::none;
  std::string listen_host = "127.0.0.1";  // supervisor: the node port
  uint16_t listen_port = 0;               // 0: any free port (listen_port() says which)
  std::string token_file;                 // "" : plain TCP; else the cluster's mutual TLS
  std::chrono::milliseconds heartbeat{500};  // defaults as config/cluster_config.hpp's
  std::chrono::milliseconds connection_timeout{5'000};
};

// A cluster supervisor's dispatcher, counted.
struct cluster_counts {
  unsigned alive = 0;             // nodes alive now
  uint64_t nodes_lost = 0;        // times a node was taken as lost, since the start
  uint64_t orphaned = 0;          // evaluations moved off lost nodes
  uint64_t straggler_copies = 0;  // evaluations copied to an idle node
};

struct session_answer {
  int exit_code = 0;                // 0, or 2 (bad input) / 3 (environment) when not ok
  std::string bytes;                // the reply's payload (EvalResult, KernelSpec)
  std::string error;
  bool timed_out = false;           // the node's deadline passed (worker_timeout)
  bool worker_died = false;         // the worker died serving it (worker_crashed)
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
  std::chrono::milliseconds deadline() const { return opts_.deadline; }
  // A node process's devices, to join a remote dispatcher with.
  const std::vector<messages::tpu_node_actor>& local_nodes() const;
  // The dispatcher's view of the nodes as text: each node with its id, whether alive, work
  // in flight and done; then the queue and the redispatch counts.
  std::string cluster_status();
  // A supervisor's session learns the JAX version from a node (the first that answers);
  // a no-op once known.
  void learn_jax_version();
  // Drains node INDEX of the dispatcher (as in the status); false with `error`.
  bool drain_node(uint32_t index, std::string& error);
  // The same counted; nullopt unless this is a cluster supervisor's session.
  std::optional<cluster_counts> cluster_counts_now();
  // A supervisor's node port once published.
  uint16_t listen_port() const { return listen_port_; }
  unsigned workers() const { return workers_; }

  const std::string& backend() const { return backend_; }
  const std::string& jax_version() const { return jax_version_; }
  const std::string& store_path() const { return store_path_; }

private:
  bool start_supervisor(std::string& error);
  session_answer load_shipped(const std::string& path);
  struct impl;
  std::unique_ptr<impl> impl_;
  session_options opts_;
  std::string backend_;
  std::string jax_version_;
  std::string store_path_;
  unsigned workers_ = 1;
  uint16_t listen_port_ = 0;
};

}  // namespace maxkernel::cli
