// The expert debugger's rules: from a failed evaluation's error class (and message) to a
// fix of a template candidate's parameters. Lowering rejects a block shape -> realign the
// blocks; VMEM OOM -> raise vmem_limit_bytes within the core's VMEM, else shrink the largest
// block; an output block revisited out of order -> reduction axis last; a numerical mismatch
// -> f32 accumulation, else another reduction order (smaller reduction blocks); a timeout of
// the interpret test -> fewer, larger steps. Other failures of a rendered template are
// template bugs at these params: one retry at the template's initial params, then give up.
#pragma once

#include "agents/expert/kernel_template.hpp"
#include "maxkernel/schema/eval.capnp.h"
#include "messages/eval_failure.hpp"

#include <set>
#include <string>

namespace maxkernel::agents::expert {

struct repair {
  bool repaired = false;
  nlohmann::json params;     // when repaired
  std::string fix;           // "vmemOom: shrink block_k 2048 -> 1024"
  std::string reason;        // what failed, or why no rule applies
};

// The first failed phase's error class name (as in eval.capnp) and message.
using messages::failure_class;
using messages::failure_message;

// `tried`: fixes already applied on this lineage (not repeated).
repair repair_params(const kernel_template& t, const template_match& m,
                     const nlohmann::json& params, const config::chip& chip,
                     schema::EvalResult::Reader failed, const std::set<std::string>& tried);

}  // namespace maxkernel::agents::expert
