// Which results the evaluation store keeps, and what is recorded next to them.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "messages/payload.hpp"
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

// A copy of `result_bytes` with the fields its answerer sets: the key, whether it came from
// the store, and the requester's candidate id (a stored result may come from another
// candidate with the same source; "" keeps the result's). Empty with `error` when the bytes
// are no EvalResult.
messages::payload stamped_result(const std::string& result_bytes, const std::string& key,
                                 bool cached, const std::string& candidate_id,
                                 std::string& error);

}  // namespace maxkernel::tpu_nodes
