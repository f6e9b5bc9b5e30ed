// The readable summary and the machine-readable JSON of one `check`.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace maxkernel::cli {

struct check_context {
  std::string kernel_path;
  std::string backend;       // jax-tpu on a TPU host; jax-cpu (lower + interpret) elsewhere
  std::string jax_version;
  std::vector<std::string> sandbox;
  double wall_seconds = 0;
  uint64_t seed = 0;
};

nlohmann::json check_json(schema::KernelSpec::Reader spec, schema::EvalResult::Reader result,
                          const check_context& ctx);
std::string check_summary(schema::KernelSpec::Reader spec, schema::EvalResult::Reader result,
                          const check_context& ctx);

}  // namespace maxkernel::cli
