#include "agents/expert/workload_args.hpp"

#include <cctype>
#include <set>

namespace maxkernel::agents::expert::moe {

namespace {

bool identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_'))
    return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_'))
      return false;
  // Python keywords and the names rendered modules define or import.
  static const std::set<std::string> reserved = {
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
    "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
    "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
    "try", "while", "with", "yield", "jax", "jnp", "lax", "np", "pl", "pltpu", "functools",
    "math", "workload",
  };
  return !reserved.count(s) && s[0] != '_';
}

}  // namespace

std::string workload_args::signature() const {
  std::string s;
  for (const auto& p : params)
    s += (s.empty() ? "" : ", ") + p;
  return s;
}

workload_args make_workload_args(schema::KernelSpec::Reader spec) {
  workload_args out;
  if (spec.getConfigurations().size() == 0)
    return out;
  auto inputs = spec.getConfigurations()[0].getInputs();
  out.reduced_by_value = spec.getFormat() != schema::SpecFormat::NATIVE;
  std::set<std::string> seen;
  bool named = true;
  for (auto in : inputs) {
    std::string name = in.getName().cStr();
    named = named && identifier(name) && seen.insert(name).second;
  }
  for (unsigned i = 0; i < inputs.size(); ++i) {
    std::string name = named ? std::string(inputs[i].getName().cStr()) : "arg" + std::to_string(i);
    out.params.push_back(name);
    if (!inputs[i].getIsStatic()) {
      out.graph_inputs.push_back(name);
      std::vector<std::string> names;
      for (auto d : inputs[i].getDimNames())
        names.push_back(d.cStr());
      out.dim_names.push_back(std::move(names));
    }
  }
  return out;
}

}  // namespace maxkernel::agents::expert::moe
