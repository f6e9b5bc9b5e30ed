// Typed interface of a worker pool: the JAX workers of one node process, shared by its
// tpu_nodes. Jobs wait in one FIFO queue for a free worker. Each job carries a time budget
// in ms, counted from its arrival at the pool; a job still queued when it runs out is
// answered with `worker_timeout` without reaching a worker.
#pragma once

#include "messages/atoms.hpp"
#include "messages/payload.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>

namespace maxkernel::messages {

using worker_pool_actor = caf::typed_actor<
  // EvalRequest, budget ms -> EvalResult (the full pipeline: lower, extract, test, profile)
  caf::replies_to<evaluate_atom, payload, uint32_t>::with<payload>,
  // task directory, budget ms -> KernelSpec
  caf::replies_to<load_atom, std::string, uint32_t>::with<payload>,
  // AnalyzeRequest, budget ms -> DataflowGraph
  caf::replies_to<analyze_atom, payload, uint32_t>::with<payload>,
  // -> NodeInfo of the pool: its workers and their states (node fields left empty)
  caf::replies_to<info_atom>::with<payload>,
  // -> (JAX version, backend), answered once a worker has started; `worker_unavailable`
  //    while every worker fails to start
  caf::replies_to<version_atom>::with<std::string, std::string>>;

}  // namespace maxkernel::messages
