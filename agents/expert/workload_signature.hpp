// The argument list a rendered kernel's workload() takes: the reference's inputs in order,
// static ones included (the worker passes them), named after the spec's inputs when those
// are Python identifiers. Maps analyze's graph-input numbering (arrays only) to them.
#pragma once

#include "maxkernel/schema/kernel_spec.capnp.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace maxkernel::agents::expert {

struct workload_signature {
  std::vector<std::string> names;     // every argument, in order
  std::vector<int> graph_inputs;      // graph input k -> index into names
  std::string args() const;           // "x, w, d_y"
  // Python name of graph input k.
  const std::string& input(int k) const { return names[static_cast<size_t>(graph_inputs[k])]; }
};

workload_signature make_signature(schema::KernelSpec::Reader spec);

// As match facts: {"args": "x, w", "names": [...], "graph_inputs": [...]} (graph input k ->
// argument index), so render() needs no spec.
nlohmann::json signature_facts(const workload_signature& sig);

// A JSON value as a Python literal (true/false/null -> True/False/None).
std::string python_literal(const nlohmann::json& j);

// "# line" comment block: template name, what matched, the params.
std::string header_comment(const std::string& template_name, const std::string& summary,
                           const std::string& params_json);

}  // namespace maxkernel::agents::expert
