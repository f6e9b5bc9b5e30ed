// A whole-model workload -> the kernel tasks of ONE step (docs/workloads.md): every kernel a
// layer runs (projections, attention, norms, MLP or MoE) and the step's head (final norm,
// logits; cross-entropy in prefill), each a native task spec (docs/spec-format.md) at the
// shapes of the whole step's batch, with how many times it runs per step. Tasks with the
// same spec body (shapes, inputs, reference, tolerance) are one task whose occurrences are
// summed. Pure: emits text, starts nothing.
#pragma once

#include "config/workload_config.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace maxkernel::config {

enum class workload_phase { prefill, decode };

struct workload_task {
  std::string name;                // file stem, unique in one expansion (`qkv_projection`)
  std::string kind;                // matmul, rmsnorm, attention, decode_attention, ...
  std::vector<std::string> roles;  // what it computes in the model, in first-seen order
  uint64_t occurrences = 0;        // runs per step
  std::vector<std::pair<std::string, int64_t>> dims;
  std::string spec;                // the native spec (YAML text); its `name` is unique too
};

const char* phase_name(workload_phase phase);

// The tasks of one step of `model` in `phase`, in first-use order (a layer's order, then the
// head).
std::vector<workload_task> expand_workload(const workload_config& model, workload_phase phase);

}  // namespace maxkernel::config
