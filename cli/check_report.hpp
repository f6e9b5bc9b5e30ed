// The readable summary and the machine-readable JSON of one `check`.
#pragma once

#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "maxkernel/schema/profile.capnp.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace maxkernel::cli {

struct check_context {
  std::string kernel_path;   // "reference" with --reference-only
  std::string backend;       // model (modeled time) | jax-tpu (measured on the device)
  std::string jax_version;
  std::vector<std::string> sandbox;
  double wall_seconds = 0;
  uint64_t seed = 0;
  bool reference_only = false;            // `result` is the reference's own evaluation
  const schema::Profile::Reader* reference = nullptr;  // the reference's profile, if any
  std::string reference_error;            // why the reference has no time
  unsigned evaluations = 0;
  unsigned cache_hits = 0;
  const schema::Diagnosis::Reader* diagnosis = nullptr;  // the profiler's, when timed
};

nlohmann::json check_json(schema::KernelSpec::Reader spec, schema::EvalResult::Reader result,
                          const check_context& ctx);
std::string check_summary(schema::KernelSpec::Reader spec, schema::EvalResult::Reader result,
                          const check_context& ctx);

}  // namespace maxkernel::cli
