// Read-only helpers over the reference's analyze summary (DataflowGraph): producers,
// consumers, graph inputs and literals of each operand, and the few jaxpr parameters the
// templates match on. Matching reads the computation, never names.
#pragma once

#include "maxkernel/schema/kernel_structure.capnp.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

// Where a value comes from: a node's result, a graph input, or a scalar literal.
struct value_ref {
  enum class kind { node, input, literal, unknown } what = kind::unknown;
  int id = -1;              // node id or input index
  std::string literal;      // JSON of the literal ("-inf" etc. as strings)
  // Which result of node `id` (analyze's operandResults); -1 when the summary does not say
  // (older summaries): callers then match the result by type.
  int result = -1;
  bool is_node() const { return what == kind::node; }
  bool is_input() const { return what == kind::input; }
  bool is_literal() const { return what == kind::literal; }
};

class graph_view {
public:
  explicit graph_view(schema::DataflowGraph::Reader graph);

  schema::DataflowGraph::Reader raw() const { return graph_; }
  size_t size() const { return graph_.getNodes().size(); }
  schema::DataflowNode::Reader node(int id) const { return graph_.getNodes()[id]; }
  std::string primitive(int id) const;
  // The node's params as JSON (an empty object when they do not parse).
  const nlohmann::json& params(int id) const { return params_[id]; }
  value_ref operand(int id, unsigned k) const;
  unsigned operand_count(int id) const;
  const std::vector<int>& consumers(int id) const { return consumers_[id]; }
  // The value behind graph output k.
  value_ref output(unsigned k) const;
  unsigned output_count() const { return graph_.getOutputs().size(); }
  schema::TensorType::Reader input_type(unsigned k) const { return graph_.getInputs()[k]; }
  unsigned input_count() const { return graph_.getInputs().size(); }
  // Shape and dtype of a value (a literal: scalar of "" dtype).
  std::vector<int64_t> shape(const value_ref& v) const;
  std::string dtype(const value_ref& v) const;
  // Follows convert_element_type and copies back to the value they read.
  value_ref skip_casts(value_ref v) const;
  // Node ids with this primitive, in graph order.
  std::vector<int> find(const std::string& primitive) const;
  // True when the node runs inside a loop or cond body (count != 1 or not evaluable).
  bool in_loop(int id) const;

private:
  schema::DataflowGraph::Reader graph_;
  std::vector<nlohmann::json> params_;
  std::vector<std::vector<int>> consumers_;
};

std::vector<int64_t> to_vector(capnp::List<int64_t>::Reader list);

}  // namespace maxkernel::agents::expert
