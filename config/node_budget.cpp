#include "config/node_budget.hpp"

#include <fmt/format.h>

namespace maxkernel::config {

namespace {

struct walker {
  size_t visited = 0;
  bool too_deep = false;

  // Returns false as soon as a limit is hit.
  bool walk(const YAML::Node& node, size_t depth) {
    if (++visited > max_yaml_nodes)
      return false;
    if (depth > max_yaml_depth) {
      too_deep = true;
      return false;
    }
    if (node.IsSequence()) {
      for (auto it = node.begin(); it != node.end(); ++it)
        if (!walk(*it, depth + 1))
          return false;
    } else if (node.IsMap()) {
      for (auto it = node.begin(); it != node.end(); ++it)
        if (!walk(it->first, depth + 1) || !walk(it->second, depth + 1))
          return false;
    }
    return true;
  }
};

}  // namespace

node_budget_result check_node_budget(const YAML::Node& root) {
  node_budget_result out;
  walker w;
  auto limit_message = [&] {
    return w.too_deep ? fmt::format("nested more than {} levels deep", max_yaml_depth)
                      : fmt::format("the document expands to more than {} YAML nodes (aliases "
                                    "of aliases?); refusing it",
                                    max_yaml_nodes);
  };
  if (root.IsMap()) {
    // Walk per top-level key so that the error can name the offending field.
    ++w.visited;
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (!w.walk(it->first, 1) || !w.walk(it->second, 1)) {
        out.ok = false;
        out.field = it->first.IsScalar() ? it->first.Scalar() : "(document)";
        out.mark = it->first.Mark();
        out.message = limit_message();
        return out;
      }
    }
    return out;
  }
  if (!w.walk(root, 0)) {
    out.ok = false;
    out.field = "(document)";
    out.mark = root.Mark();
    out.message = limit_message();
  }
  return out;
}

}  // namespace maxkernel::config
