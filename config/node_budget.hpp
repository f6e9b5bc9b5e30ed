// Guards against YAML bombs: aliases let a small file describe an exponentially large tree
// ("billion laughs"). yaml-cpp shares aliased nodes, so parsing is cheap, but any walk over
// the tree would not be. Walk it once, counting every node as if aliases were expanded,
// and refuse documents past a budget or nested too deep.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <string>

namespace maxkernel::config {

constexpr size_t max_yaml_nodes = 100000;
constexpr size_t max_yaml_depth = 64;

struct node_budget_result {
  bool ok = true;
  std::string field;  // top-level key under which the limit was hit
  YAML::Mark mark;    // where that key is
  std::string message;
};

node_budget_result check_node_budget(const YAML::Node& root);

}  // namespace maxkernel::config
