#include "agents/expert/moe_patterns.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace maxkernel::agents::expert::moe {

namespace {

std::vector<int64_t> ints(const nlohmann::json& j, const char* key) {
  std::vector<int64_t> v;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array())
    return v;
  for (const auto& x : *it)
    if (x.is_number_integer())
      v.push_back(x.get<int64_t>());
  return v;
}

bool is_float(const std::string& d) { return d.find("float") != std::string::npos; }
bool is_int(const std::string& d) { return d.find("int") != std::string::npos; }

// A literal, or a broadcast / cast of one (a scalar constant spelled as a node).
bool constant_like(const graph_view& g, value_ref v) {
  for (int depth = 0; depth < 4 && v.is_node(); ++depth) {
    auto p = g.primitive(v.id);
    if ((p != "broadcast_in_dim" && p != "convert_element_type") || g.operand_count(v.id) != 1)
      return false;
    if (p == "broadcast_in_dim" && g.node(v.id).getOperands()[0].getShape().size() != 0)
      return false;
    v = g.operand(v.id, 0);
  }
  return v.is_literal();
}

}  // namespace

bool is_elementwise(const std::string& p) {
  static const std::set<std::string> s = {
    "add", "add_any", "sub", "mul", "div", "max", "min", "pow", "neg", "sign", "floor", "ceil",
    "abs", "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "sqrt",
    "rsqrt", "erf", "erfc", "square", "integer_pow", "select_n", "clamp", "convert_element_type",
    "reduce_precision", "stop_gradient", "copy", "copy_p", "eq", "ne", "lt", "le", "gt", "ge",
    "and", "or", "not", "is_finite",
  };
  return s.count(p) > 0;
}

value_ref skip_widening(const graph_view& g, value_ref v) {
  while (v.is_node()) {
    auto p = g.primitive(v.id);
    if (p == "copy" || p == "copy_p") {
      v = g.operand(v.id, 0);
      continue;
    }
    if (p != "convert_element_type")
      break;
    auto from = g.node(v.id).getOperands()[0].getDtype().cStr();
    auto to = g.node(v.id).getResults()[0].getDtype().cStr();
    if (!is_float(from) || !is_float(to) || dtype_bytes(to) < dtype_bytes(from))
      break;
    v = g.operand(v.id, 0);
  }
  return v;
}

value_ref skip_index_plumbing(const graph_view& g, value_ref v) {
  for (int guard = 0; guard < 16 && v.is_node(); ++guard) {
    auto p = g.primitive(v.id);
    auto node = g.node(v.id);
    auto in_shape = node.getOperands().size() ? to_vector(node.getOperands()[0].getShape())
                                              : std::vector<int64_t>{};
    auto out_shape = to_vector(node.getResults()[0].getShape());
    auto drop_units = [](std::vector<int64_t> s) {
      s.erase(std::remove(s.begin(), s.end(), 1), s.end());
      return s;
    };
    if (p == "convert_element_type" && is_int(node.getOperands()[0].getDtype().cStr()) &&
        is_int(node.getResults()[0].getDtype().cStr())) {
      v = g.operand(v.id, 0);
    } else if ((p == "broadcast_in_dim" || p == "reshape" || p == "squeeze") &&
               drop_units(in_shape) == drop_units(out_shape) && !in_shape.empty()) {
      v = g.operand(v.id, 0);
    } else if (p == "select_n" && g.operand_count(v.id) == 3) {
      // jnp's wrap of negative indices: select_n(i < 0, i, i + n)
      auto pred = g.operand(v.id, 0), a = g.operand(v.id, 1), b = g.operand(v.id, 2);
      if (!pred.is_node() || g.primitive(pred.id) != "lt" || !b.is_node() ||
          g.primitive(b.id) != "add")
        break;
      auto same = [&](value_ref x, value_ref y) { return x.what == y.what && x.id == y.id; };
      if (!same(g.operand(pred.id, 0), a) || !same(g.operand(b.id, 0), a))
        break;
      v = a;
    } else if (p == "clamp" && g.operand_count(v.id) == 3) {
      v = g.operand(v.id, 1);
    } else {
      break;
    }
  }
  return v;
}

std::optional<one_hot> match_one_hot(const graph_view& g, value_ref v) {
  one_hot oh;
  if (!v.is_node() || g.primitive(v.id) != "convert_element_type")
    return std::nullopt;
  if (std::string(g.node(v.id).getOperands()[0].getDtype().cStr()) != "bool")
    return std::nullopt;
  oh.nodes.push_back(v.id);
  auto eq = g.operand(v.id, 0);
  if (!eq.is_node() || g.primitive(eq.id) != "eq")
    return std::nullopt;
  oh.nodes.push_back(eq.id);
  auto shape = g.shape(eq);
  for (int side = 0; side < 2; ++side) {
    auto io = g.operand(eq.id, side);
    auto other = g.operand(eq.id, 1 - side);
    // the iota side, maybe broadcast: track where the iota's axes land in the eq operand
    auto it = io;
    std::vector<int> io_nodes;
    auto io_shape = g.shape(io);
    std::vector<int64_t> axis_map(io_shape.size());
    for (size_t a = 0; a < axis_map.size(); ++a)
      axis_map[a] = static_cast<int64_t>(a);
    while (it.is_node() && (g.primitive(it.id) == "broadcast_in_dim" ||
                            g.primitive(it.id) == "convert_element_type")) {
      if (g.primitive(it.id) == "broadcast_in_dim") {
        auto bd = ints(g.params(it.id), "broadcast_dimensions");
        std::vector<int64_t> next;
        for (auto b : bd)
          next.push_back(b < static_cast<int64_t>(axis_map.size()) ? axis_map[b] : -1);
        axis_map = next;
      }
      io_nodes.push_back(it.id);
      it = g.operand(it.id, 0);
    }
    if (!it.is_node() || g.primitive(it.id) != "iota" || io_shape.size() != shape.size())
      continue;
    auto ishape = g.shape(it);
    int dim = g.params(it.id).value("dimension", -1);
    if (dim < 0 || static_cast<size_t>(dim) >= ishape.size() || axis_map.size() != ishape.size())
      continue;
    int axis = static_cast<int>(axis_map[dim]);
    if (axis < 0 || static_cast<size_t>(axis) >= shape.size() || io_shape[axis] != shape[axis])
      continue;
    // the iota side varies along the class axis only
    bool units = true;
    for (size_t a = 0; a < io_shape.size(); ++a)
      units = units && (static_cast<int>(a) == axis || io_shape[a] == 1);
    auto oshape = g.shape(other);
    if (!units || oshape.size() != shape.size() || oshape[axis] != 1)
      continue;
    io_nodes.push_back(it.id);
    oh.nodes.insert(oh.nodes.end(), io_nodes.begin(), io_nodes.end());
    oh.class_axis = axis;
    oh.classes = shape[axis];
    oh.ids = skip_index_plumbing(g, other);
    // the compared value's type (the ids may be one result of several, as top_k's indices)
    if (!is_int(std::string(g.node(eq.id).getOperands()[1 - side].getDtype().cStr())))
      return std::nullopt;
    return oh;
  }
  return std::nullopt;
}

std::optional<selected_weights> match_selected_weights(const graph_view& g, value_ref v) {
  v = skip_widening(g, v);
  if (!v.is_node())
    return std::nullopt;
  selected_weights s;
  auto p = g.primitive(v.id);
  if (p == "gather" && g.operand_count(v.id) == 2) {
    auto w = g.operand(v.id, 0);
    auto wshape = g.shape(w);
    const auto& params = g.params(v.id);
    auto dn = params.value("dimension_numbers", nlohmann::json::object());
    auto sizes = ints(params, "slice_sizes");
    if (wshape.size() != 3 || ints(dn, "collapsed_slice_dims") != std::vector<int64_t>{0} ||
        ints(dn, "start_index_map") != std::vector<int64_t>{0} ||
        ints(dn, "offset_dims") != std::vector<int64_t>{1, 2} ||
        sizes != std::vector<int64_t>{1, wshape[1], wshape[2]} ||
        !ints(dn, "operand_batching_dims").empty())
      return std::nullopt;
    auto idx = g.operand(v.id, 1);
    auto ishape = g.shape(idx);
    if (ishape.size() != 2 || ishape[1] != 1)
      return std::nullopt;
    s.weights = w;
    s.ids = skip_index_plumbing(g, idx);
    if (g.shape(s.ids).size() != 1 || !is_int(g.dtype(s.ids)))
      return std::nullopt;
    s.row_axis = 0;
    s.axes = {1, 2};
    s.nodes = {v.id};
    return s;
  }
  if (p == "dot_general" && g.operand_count(v.id) == 2) {
    const auto& params = g.params(v.id);
    if (!ints(params, "lhs_batch").empty() || ints(params, "lhs_contracting").size() != 1)
      return std::nullopt;
    for (int side = 0; side < 2; ++side) {
      auto oh = match_one_hot(g, skip_widening(g, g.operand(v.id, side)));
      auto w = g.operand(v.id, 1 - side);
      auto wshape = g.shape(w);
      if (!oh || wshape.size() != 3)
        continue;
      auto ohc = ints(params, side == 0 ? "lhs_contracting" : "rhs_contracting")[0];
      auto wc = ints(params, side == 0 ? "rhs_contracting" : "lhs_contracting")[0];
      if (ohc != oh->class_axis || wc != 0 || g.shape(oh->ids).size() != 1 ||
          g.shape(skip_widening(g, g.operand(v.id, side))).size() != 2)
        continue;
      s.weights = w;
      s.ids = oh->ids;
      // result: lhs free dims, then rhs free dims
      if (side == 0) {
        s.row_axis = 0;
        s.axes = {1, 2};
      } else {
        s.row_axis = 2;
        s.axes = {0, 1};
      }
      s.nodes = oh->nodes;
      s.nodes.push_back(v.id);
      return s;
    }
  }
  return std::nullopt;
}

std::vector<int> elementwise_chain(const graph_view& g, int start) {
  std::vector<int> chain{start};
  auto shape = g.shape(value_ref{value_ref::kind::node, start, ""});
  std::set<int> outputs;
  for (unsigned k = 0; k < g.output_count(); ++k)
    if (g.output(k).is_node())
      outputs.insert(g.output(k).id);
  int cur = start;
  while (!outputs.count(cur) && g.consumers(cur).size() == 1) {
    int c = g.consumers(cur)[0];
    if (!is_elementwise(g.primitive(c)) || g.shape(value_ref{value_ref::kind::node, c, ""}) != shape)
      break;
    bool ok = true;
    int uses = 0;
    for (unsigned k = 0; k < g.operand_count(c); ++k) {
      auto v = g.operand(c, k);
      if (v.is_node() && v.id == cur)
        ++uses;
      else if (!constant_like(g, v))
        ok = false;
    }
    if (!ok || uses == 0)
      break;
    chain.push_back(c);
    cur = c;
  }
  return chain;
}

int elementwise_join(const graph_view& g, int a, int b) {
  for (int h = static_cast<int>(g.size()) - 1; h > std::max(a, b); --h) {
    if (!is_elementwise(g.primitive(h)) || g.in_loop(h))
      continue;
    std::set<int> region;
    std::vector<int> stack{h};
    bool ok = true, saw_a = false, saw_b = false;
    while (ok && !stack.empty()) {
      int n = stack.back();
      stack.pop_back();
      if (n == a || n == b) {
        saw_a = saw_a || n == a;
        saw_b = saw_b || n == b;
        continue;
      }
      if (!region.insert(n).second)
        continue;
      if (!is_elementwise(g.primitive(n)) || g.in_loop(n)) {
        ok = false;
        break;
      }
      for (unsigned k = 0; k < g.operand_count(n); ++k) {
        auto v = g.operand(n, k);
        if (v.is_literal() || constant_like(g, v))
          continue;
        if (!v.is_node()) {
          ok = false;
          break;
        }
        stack.push_back(v.id);
      }
    }
    if (!ok || !saw_a || !saw_b)
      continue;
    // nothing but h leaves the region
    for (int n : region)
      if (n != h)
        for (int c : g.consumers(n))
          ok = ok && region.count(c);
    for (int s : {a, b})
      for (int c : g.consumers(s))
        ok = ok && region.count(c);
    if (ok)
      return h;
  }
  return -1;
}

std::set<int> inputs_reached(const graph_view& g, value_ref v) {
  std::set<int> found;
  std::vector<char> seen(g.size(), 0);
  std::vector<value_ref> stack{v};
  while (!stack.empty()) {
    auto x = stack.back();
    stack.pop_back();
    if (x.is_input()) {
      found.insert(x.id);
    } else if (x.is_node() && !seen[x.id]) {
      seen[x.id] = 1;
      for (unsigned k = 0; k < g.operand_count(x.id); ++k)
        stack.push_back(g.operand(x.id, k));
    }
  }
  return found;
}

std::vector<value_ref> graph_outputs(const graph_view& g) {
  std::vector<value_ref> out;
  for (unsigned k = 0; k < g.output_count(); ++k)
    out.push_back(g.output(k));
  return out;
}

std::string py_function(const std::string& name, const std::vector<std::string>& args,
                        const replay_code& code, const std::string& result) {
  std::string s = "def " + name + "(";
  for (size_t i = 0; i < args.size(); ++i)
    s += (i ? ", " : "") + args[i];
  s += "):\n" + code.code(4) + "    return " + result + "\n";
  return s;
}

int64_t dtype_bytes(const std::string& d) {
  if (d == "float64" || d == "int64" || d == "uint64" || d == "complex64")
    return 8;
  if (d == "float32" || d == "int32" || d == "uint32")
    return 4;
  if (d == "bfloat16" || d == "float16" || d == "int16" || d == "uint16")
    return 2;
  return 1;
}

int64_t sublane_align(const std::string& d) { return 8 * std::max<int64_t>(1, 4 / dtype_bytes(d)); }

int64_t largest_fitting(const std::vector<int64_t>& candidates,
                        const std::function<bool(int64_t)>& fits) {
  for (auto c : candidates)
    if (fits(c))
      return c;
  return candidates.empty() ? 0 : candidates.back();
}

}  // namespace maxkernel::agents::expert::moe
