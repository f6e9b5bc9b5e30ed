// The strategy playbook: the moves a TPU kernel engineer makes on a candidate rendered from a
// template, each a concrete change of its parameters (block sizes under the VMEM budget and
// the alignment rules, grid order, dimension semantics, buffering, VMEM limit, ...). Which
// move comes first is driven by the profiler's diagnosis: its suggestions, in its order,
// become the best-ranked moves; the remaining tunables give lower-ranked exploration moves.
// Every move is checked before it is offered: a legal block, a really different kernel
// (effective blocks differ), and VMEM within the chip (raising vmem_limit_bytes when the
// scoped default is too small but the core's VMEM is not).
#pragma once

#include "agents/expert/kernel_template.hpp"
#include "agents/expert/move_evidence.hpp"
#include "maxkernel/schema/agent.capnp.h"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

struct move {
  std::string name;          // growBlock, shrinkBlock, reorderGrid, ... (docs/agents.md)
  nlohmann::json params;     // the child's whole parameter set
  nlohmann::json changes;    // only what differs from the parent
  std::string rationale;
  std::string expected_effect;
  double score = 0;          // higher first
};

// The parameter key a move set would be recorded under (to skip kernels already tried); the
// VMEM limit is not part of it.
std::string params_key(const std::string& template_name, const nlohmann::json& params);

// VMEM the scoped limit allows for these params: their vmem_limit_bytes, else the chip's.
int64_t vmem_limit(const nlohmann::json& params, const config::chip& chip);

// Makes params fit: when the need exceeds the scoped limit but fits the core's VMEM (with
// headroom), raises vmem_limit_bytes (if the template exposes it). false when it cannot fit.
bool fit_vmem(const kernel_template& t, const template_match& m, nlohmann::json& params,
              const config::chip& chip);

// What the search knows when a candidate is expanded.
struct search_so_far {
  std::set<std::string> seen;          // params_key of every kernel tried (not offered again)
  std::map<std::string, double> timed; // params_key -> time (us) of the correct ones
  double parent_us = 0;                // the expanded candidate's time; 0: not known
  std::vector<finding> findings;       // changes that made a candidate faster, largest gain
                                       // first: `mergeFinding` moves
};

// Moves from `params`, best first; `diagnosis` may be null (no profile yet). Findings are
// ranked after the diagnosis's suggestions and before exploration. A block step whose kernel
// was tried and timed like the parent (a plateau: block_s0 2 no faster than 1) is taken one
// step further in the same direction instead of being dropped.
std::vector<move> playbook_moves(const kernel_template& t, const template_match& m,
                                 const nlohmann::json& params, const config::chip& chip,
                                 const schema::Diagnosis::Reader* diagnosis,
                                 const search_so_far& known = {});

}  // namespace maxkernel::agents::expert
