// An EvalRequest for one kernel source (or the spec's reference) against a spec: the one
// place commands and benchmarks build them.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"

#include <cstdint>
#include <string>
#include <vector>

namespace maxkernel::messages {

struct request_settings {
  std::string chip;              // "" = the spec's
  bool full = false;
  std::vector<uint64_t> seeds;
  bool reference = false;
  bool profile_only = false;     // lower, extract and profile; no test
  // The tester's choices (EvalOptions, agents/tester): "" leaves the worker's defaults.
  std::string value_mode;        // "", large, zeros, sparse
  double value_scale = 0;        // for large; 0: the worker's default
  std::string shape_mode;        // "", ragged
  // The candidate's id when the caller holds it already (a lineage sends 1-4 requests per
  // candidate); "" = the sha256 of the source, computed here.
  std::string candidate_id;
  // EvalOptions.storeScope: stored results answer only requests of the same scope.
  std::string store_scope;
};

// The candidate's id is the sha256 of its source (settings.candidate_id when given);
// `origin` says where it came from.
void build_eval_request(schema::EvalRequest::Builder request, schema::KernelSpec::Reader spec,
                        const std::string& source, const std::string& origin,
                        const request_settings& settings);

}  // namespace maxkernel::messages
