// Whether a candidate's parameters have the types its template reads them as, checked
// before any size is computed from them: parameters also come from operators (hitl edits),
// an LLM planner and the command line, and a string where a block size goes must be a
// bad-input error that names the parameter, not an exception out of a json accessor.
#pragma once

#include "agents/expert/kernel_template.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace maxkernel::agents::expert {

// Every block_* key a positive integer, vmem_limit_bytes a positive number, and a value of a
// choice tunable of the same JSON type as its choices. False with `error` naming the first
// parameter that is not.
bool check_param_types(const kernel_template& t, const template_match& m,
                       const nlohmann::json& params, std::string& error);

}  // namespace maxkernel::agents::expert
