// The signature of a rendered kernel module's workload(): one parameter per input of the
// spec (static arguments included, as the worker passes them), and the Python name of each
// graph input (analyze numbers only the non-static ones).
#pragma once

#include "maxkernel/schema/kernel_spec.capnp.h"

#include <string>
#include <vector>

namespace maxkernel::agents::expert::moe {

struct workload_args {
  std::vector<std::string> params;        // every argument, in order
  std::vector<std::string> graph_inputs;  // graph input k -> its parameter name
  std::vector<std::vector<std::string>> dim_names;  // graph input k -> per axis, "" unnamed
  bool reduced_by_value = false;          // a task directory: equal sizes reduce alike
  std::string signature() const;          // "x, w, group_sizes"
};

// Parameter names: the spec's input names when they are distinct Python identifiers (not
// keywords nor names the modules use), else arg<i>.
workload_args make_workload_args(schema::KernelSpec::Reader spec);

}  // namespace maxkernel::agents::expert::moe
