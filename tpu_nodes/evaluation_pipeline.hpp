// One full evaluation of an EvalRequest on one JAX worker: lower -> extract -> profile (the
// model, or the device's time on jax-tpu) -> test, the phases merged into one EvalResult.
// Plain C++ and blocking: a pool worker runs it on its own thread.
#pragma once

#include "maxkernel/schema/eval.capnp.h"

#include <chrono>
#include <string>

namespace maxkernel::tpu_nodes {

class worker_client;

struct pipeline_settings {
  std::string backend = "model";  // model | jax-tpu
  // Every worker call gets what is left until then; a step that would start after it is
  // not started (the request is then answered with a timeout outcome).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::now()
                                                   + std::chrono::minutes(10);
};

// The EvalResult of a request, or why the request itself failed: a bad spec or chip
// (badInput), a task too large (tooLarge), the deadline (timeout), a bug (internal).
// Candidate failures, crashes and hangs included, are results, never request failures.
struct pipeline_outcome {
  bool ok = false;
  std::string result;  // encoded EvalResult when ok
  schema::ErrorClass error_class = schema::ErrorClass::NONE;
  std::string message;
};

// The candidate: lower, extract and, when it lowers, always a profile at the spec's full
// shapes (model: price_kernel on the chip of options.chip, else the spec's; a VMEM OOM fails
// the lower phase as the real compiler would, and test and profile are skipped) and the
// test. With request.reference: the spec's reference is profiled alone (model: analyze +
// price_xla; jax-tpu: not supported by the worker yet, a failed profile phase).
pipeline_outcome run_evaluation(worker_client& worker, schema::EvalRequest::Reader request,
                                const pipeline_settings& settings);

// Phases of `from` replace those of `into` with the same phase; others are appended.
void merge_phases(schema::EvalResult::Builder into, schema::EvalResult::Reader from);

// Whether a phase that decides correctness (load, lower, test) failed. A failed profile is
// reported but does not make a kernel incorrect.
bool correctness_phase_failed(schema::EvalResult::Reader result);

}  // namespace maxkernel::tpu_nodes
