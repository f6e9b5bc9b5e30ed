// One evaluation through the command's tpu_node, decoded.
#pragma once

#include "messages/eval_request.hpp"
#include "cli/node_session.hpp"
#include "messages/capnp_io.hpp"

#include <optional>
#include <string>

namespace maxkernel::cli {

struct evaluated {
  std::optional<messages::decoded_message> message;
  int exit_code = 0;  // 0, else 2 (bad input) or 3 (environment) and `error`
  std::string error;
  bool timed_out = false;  // the node's deadline passed
  schema::EvalResult::Reader result() { return message->root<schema::EvalResult>(); }
};

evaluated evaluate(node_session& session, schema::KernelSpec::Reader spec,
                   const std::string& source, const std::string& origin,
                   const messages::request_settings& settings);

// The reference's time and the baseline's (when the spec has one), profiled at full size;
// 0 where there is none. `evaluations` counts the requests made.
struct reference_times {
  double reference_us = 0;
  double baseline_us = 0;
  unsigned evaluations = 0;
  unsigned cache_hits = 0;
};
// What to tell when a reference runs past the node's deadline (it hangs).
std::string reference_hangs(schema::KernelSpec::Reader spec, const node_session& session,
                            const char* while_doing);

// `store_scope`: EvalOptions.storeScope of both requests ("" the shared results).
reference_times time_reference_and_baseline(node_session& session, schema::KernelSpec::Reader spec,
                                            const std::string& chip,
                                            const std::string& store_scope = "");

// The reference's analyze summary (configuration 0), decoded and readable many times: what
// the brains match and reason on. 0, or the exit code and `error` (2 when the reference's
// code does not finish tracing within the deadline: the spec's fault).
int analyze_reference(node_session& session, schema::KernelSpec::Reader spec,
                      std::optional<messages::decoded_message>& graph, std::string& error);

// The first phase of an evaluation that failed, if one did.
std::optional<schema::PhaseResult::Reader> failed_phase(schema::EvalResult::Reader result);

// Why an evaluation has no profile, from its failed phase.
std::string failure_of(schema::EvalResult::Reader result);

}  // namespace maxkernel::cli
