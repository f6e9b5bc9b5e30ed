#include "agents/expert/param_check.hpp"

#include <fmt/format.h>

namespace maxkernel::agents::expert {

namespace {

const char* type_name(const nlohmann::json& v) {
  if (v.is_boolean())
    return "true or false";
  if (v.is_number())
    return "a number";
  if (v.is_string())
    return "a string";
  return v.type_name();
}

bool same_kind(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number())
    return true;
  return a.type() == b.type();
}

}  // namespace

bool check_param_types(const kernel_template& t, const template_match& m,
                       const nlohmann::json& params, std::string& error) {
  if (!params.is_object()) {
    error = "params must be a JSON object";
    return false;
  }
  for (const auto& [key, value] : params.items()) {
    if (key.rfind("block_", 0) == 0 &&
        !(value.is_number_integer() && value.get<int64_t>() >= 1)) {
      error = fmt::format("param {} must be a positive integer, not {}", key, value.dump());
      return false;
    }
    if (key == "vmem_limit_bytes" && !(value.is_number() && value.get<double>() > 0)) {
      error = fmt::format("param {} must be a positive number, not {}", key, value.dump());
      return false;
    }
  }
  for (const auto& u : t.tunables(m)) {
    auto it = params.find(u.name);
    if (it == params.end() || u.what != tunable::kind::choice || u.choices.empty())
      continue;
    if (!same_kind(*it, u.choices.front())) {
      error = fmt::format("param {} must be {} (one of {}), not {}", u.name,
                          type_name(u.choices.front()), nlohmann::json(u.choices).dump(),
                          it->dump());
      return false;
    }
  }
  return true;
}

}  // namespace maxkernel::agents::expert
