#include "agents/expert/workload_signature.hpp"

#include <cctype>
#include <set>

namespace maxkernel::agents::expert {

namespace {

bool identifier(const std::string& s) {
  static const std::set<std::string> reserved = {
      "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
      "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
      "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise",
      "return", "try", "while", "with", "yield",
      // names the templates use at module level
      "jax", "jnp", "pl", "pltpu", "functools", "math", "np", "PARAMS", "workload"};
  if (s.empty() || reserved.count(s) || s[0] == '_' ||
      !(std::isalpha(static_cast<unsigned char>(s[0]))))
    return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_'))
      return false;
  return true;
}

}  // namespace

std::string workload_signature::args() const {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? ", " : "") + names[i];
  return out;
}

workload_signature make_signature(schema::KernelSpec::Reader spec) {
  workload_signature sig;
  if (spec.getConfigurations().size() == 0)
    return sig;
  auto inputs = spec.getConfigurations()[0].getInputs();
  std::set<std::string> used;
  for (unsigned i = 0; i < inputs.size(); ++i) {
    std::string name = inputs[i].getName().cStr();
    if (!identifier(name) || used.count(name))
      name = "arg" + std::to_string(i);
    used.insert(name);
    sig.names.push_back(name);
    if (!inputs[i].getIsStatic())
      sig.graph_inputs.push_back(static_cast<int>(i));
  }
  return sig;
}

nlohmann::json signature_facts(const workload_signature& sig) {
  return {{"args", sig.args()}, {"names", sig.names}, {"graph_inputs", sig.graph_inputs}};
}

std::string python_literal(const nlohmann::json& j) {
  std::string s = j.dump();
  std::string out;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '"' && (i == 0 || s[i - 1] != '\\'))
      in_str = !in_str;
    if (!in_str) {
      if (s.compare(i, 4, "true") == 0) {
        out += "True";
        i += 3;
        continue;
      }
      if (s.compare(i, 5, "false") == 0) {
        out += "False";
        i += 4;
        continue;
      }
      if (s.compare(i, 4, "null") == 0) {
        out += "None";
        i += 3;
        continue;
      }
    }
    out += c;
  }
  return out;
}

std::string header_comment(const std::string& template_name, const std::string& summary,
                           const std::string& params_json) {
  return "# maxkernel expert template: " + template_name + "\n# matched: " + summary +
         "\n# params: " + params_json;
}

}  // namespace maxkernel::agents::expert
