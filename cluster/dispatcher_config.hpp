// How the dispatcher shares work among its TPU nodes: credits, straggler copies, timeouts.
// docs/dispatcher.md describes the policy.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace maxkernel::cluster {

struct dispatcher_config {
  // Evaluations a node holds at once. A model-backend node shares its host's worker pool,
  // so one request per node at a time is the natural unit.
  unsigned credits_per_node = 1;
  // A request in flight longer than max(straggler_min, straggler_factor x the median
  // duration of the last `straggler_window` completed evaluations) is sent again to an idle
  // node, once there are `straggler_samples` completions to take the median over.
  std::chrono::milliseconds straggler_min{10'000};
  double straggler_factor = 2.0;
  std::size_t straggler_window = 32;
  std::size_t straggler_samples = 3;
  // A request to a node fails at the transport level (the node is then taken as gone) after
  // its deadline plus this margin; the node's own timeout (worker_timeout) comes first.
  std::chrono::milliseconds reply_margin{5'000};
  // The deadline assumed for requests that name none (a tpu_node's default, 10 min): their
  // transport timeout is this plus reply_margin.
  std::chrono::milliseconds default_deadline{600'000};
  // A node that refused (overloaded) while none of our requests was in flight there gets
  // work again after this long (otherwise: when one of its requests finishes).
  std::chrono::milliseconds overload_retry{1'000};
  // How long a joining node may take to describe itself (its nodeId in the status).
  std::chrono::milliseconds info_timeout{10'000};
  // A cluster's dispatcher starts before its nodes and outlives the loss of all of them:
  // with no node alive it keeps requests (each until its deadline) for the next node that
  // joins, instead of answering worker_unavailable.
  bool wait_for_nodes = false;
  // Where the dispatcher says what an operator should know (requests waiting for a node of
  // their chip); called on the dispatcher's thread. Empty: not said.
  std::function<void(const std::string&)> log;
};

}  // namespace maxkernel::cluster
