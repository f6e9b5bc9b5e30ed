#include "agents/expert/graph_view.hpp"

namespace maxkernel::agents::expert {

std::vector<int64_t> to_vector(capnp::List<int64_t>::Reader list) {
  std::vector<int64_t> v;
  v.reserve(list.size());
  for (auto x : list)
    v.push_back(x);
  return v;
}

graph_view::graph_view(schema::DataflowGraph::Reader graph) : graph_(graph) {
  auto nodes = graph.getNodes();
  params_.resize(nodes.size());
  consumers_.resize(nodes.size());
  for (unsigned i = 0; i < nodes.size(); ++i) {
    auto n = nodes[i];
    auto parsed = nlohmann::json::parse(n.getParams().cStr(), nullptr, false);
    params_[i] = parsed.is_object() ? parsed : nlohmann::json::object();
    for (int producer : n.getOperandIds())
      if (producer >= 0 && static_cast<unsigned>(producer) < nodes.size()) {
        auto& c = consumers_[producer];
        if (c.empty() || c.back() != static_cast<int>(i))
          c.push_back(static_cast<int>(i));
      }
  }
}

std::string graph_view::primitive(int id) const { return node(id).getPrimitive().cStr(); }

unsigned graph_view::operand_count(int id) const { return node(id).getOperands().size(); }

value_ref graph_view::operand(int id, unsigned k) const {
  auto n = node(id);
  value_ref v;
  if (k < n.getOperandIds().size() && n.getOperandIds()[k] >= 0) {
    v.what = value_ref::kind::node;
    v.id = n.getOperandIds()[k];
    if (k < n.getOperandResults().size())
      v.result = n.getOperandResults()[k];
  } else if (k < n.getOperandInputs().size() && n.getOperandInputs()[k] >= 0) {
    v.what = value_ref::kind::input;
    v.id = n.getOperandInputs()[k];
  } else if (k < n.getOperandLiterals().size() && n.getOperandLiterals()[k].size() > 0) {
    v.what = value_ref::kind::literal;
    v.literal = n.getOperandLiterals()[k].cStr();
  }
  return v;
}

value_ref graph_view::output(unsigned k) const {
  value_ref v;
  if (k < graph_.getOutputIds().size() && graph_.getOutputIds()[k] >= 0) {
    v.what = value_ref::kind::node;
    v.id = graph_.getOutputIds()[k];
  } else if (k < graph_.getOutputInputs().size() && graph_.getOutputInputs()[k] >= 0) {
    v.what = value_ref::kind::input;
    v.id = graph_.getOutputInputs()[k];
  }
  return v;
}

std::vector<int64_t> graph_view::shape(const value_ref& v) const {
  if (v.is_node() && node(v.id).getResults().size() > 0)
    return to_vector(node(v.id).getResults()[0].getShape());
  if (v.is_input())
    return to_vector(input_type(v.id).getShape());
  return {};
}

std::string graph_view::dtype(const value_ref& v) const {
  if (v.is_node() && node(v.id).getResults().size() > 0)
    return node(v.id).getResults()[0].getDtype().cStr();
  if (v.is_input())
    return input_type(v.id).getDtype().cStr();
  return "";
}

value_ref graph_view::skip_casts(value_ref v) const {
  while (v.is_node()) {
    auto p = primitive(v.id);
    if (p != "convert_element_type" && p != "copy" && p != "copy_p" &&
        p != "reduce_precision" && p != "optimization_barrier")
      break;
    v = operand(v.id, 0);
  }
  return v;
}

std::vector<int> graph_view::find(const std::string& prim) const {
  std::vector<int> ids;
  for (unsigned i = 0; i < size(); ++i)
    if (primitive(static_cast<int>(i)) == prim)
      ids.push_back(static_cast<int>(i));
  return ids;
}

bool graph_view::in_loop(int id) const { return node(id).getCount() != 1.0; }

}  // namespace maxkernel::agents::expert
