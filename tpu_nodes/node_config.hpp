// What one tpu_node (one device) is: its identity, backend, queue bound and deadlines.
#pragma once

#include <chrono>
#include <string>

namespace maxkernel::search {
class evaluation_store;
}

namespace maxkernel::tpu_nodes {

class task_files;

struct node_config {
  std::string node_id;             // unique in the cluster, e.g. "host:0"
  unsigned device = 0;             // device index on its host
  std::string chip = "v6e";        // the device's chip; a request naming no chip gets it
  std::string backend = "model";   // model | jax-tpu; must be the pool's
  // Requests accepted and not finished (waiting for the pool, running, or in simulated
  // device time); one more is refused at once with error_code::overloaded.
  unsigned queue_capacity = 64;
  // Deadline of a request that names none; past it the requester gets worker_timeout.
  std::chrono::milliseconds default_deadline{600'000};
  // The evaluation store (may be null: no cache). Not owned; must outlive the node.
  search::evaluation_store* store = nullptr;
  // Model backend: every evaluation occupies the simulated device this long; replies are
  // delayed accordingly (by timers, never by sleeping a thread). 0: off.
  std::chrono::milliseconds simulate_device{0};
  // Where task directories shipped with requests (KernelSpec.taskFiles, LoadRequest.taskFiles)
  // are written for the workers (tpu_nodes/task_files.hpp); shared by the devices of a
  // process. Not owned; must outlive the node. Null: shipped files are ignored and the
  // workers read sourcePath as it is.
  task_files* shipped = nullptr;
};

}  // namespace maxkernel::tpu_nodes
