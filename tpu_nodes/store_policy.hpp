// Which results the evaluation store keeps, and what is recorded next to them.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "search/evaluation_store.hpp"

#include <string>

namespace maxkernel::tpu_nodes {

// Candidate failures are deterministic and recorded (crashes included: the same source
// crashes again). Not recorded: timeouts (they depend on the deadline and the load), the
// node's own faults (internal, overloaded) and failures that are not the candidate's (bad
// input, too large: the spec or the node's chip files and limits).
bool recordable(schema::EvalResult::Reader result);

// The first failed phase's error class as its schema name ("" when no phase failed).
std::string failure_class(schema::EvalResult::Reader result);

search::evaluation_record record_for(const std::string& key, const std::string& result_bytes,
                                     schema::EvalResult::Reader result,
                                     const std::string& spec_name, const std::string& chip);

}  // namespace maxkernel::tpu_nodes
