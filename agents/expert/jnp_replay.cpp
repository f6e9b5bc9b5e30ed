#include "agents/expert/jnp_replay.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace maxkernel::agents::expert {

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

std::vector<std::vector<int64_t>> pairs(const nlohmann::json& j, const char* key) {
  std::vector<std::vector<int64_t>> v;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array())
    return v;
  for (const auto& x : *it) {
    std::vector<int64_t> p;
    if (x.is_array())
      for (const auto& y : x)
        if (y.is_number_integer())
          p.push_back(y.get<int64_t>());
    v.push_back(p);
  }
  return v;
}

std::string tuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (auto x : v)
    s += std::to_string(x) + ", ";
  return s + ")";
}

std::string tuple_of_pairs(const std::vector<std::vector<int64_t>>& v) {
  std::string s = "(";
  for (const auto& p : v)
    s += tuple(p) + ", ";
  return s + ")";
}

std::string py_dtype(const std::string& dtype) {
  return dtype == "bool" ? "jnp.bool_" : "jnp." + dtype;
}

std::string literal_value(const std::string& lit) {
  if (lit == "\"inf\"" || lit == "inf")
    return "float('inf')";
  if (lit == "\"-inf\"" || lit == "-inf")
    return "float('-inf')";
  if (lit == "\"nan\"" || lit == "nan")
    return "float('nan')";
  if (lit == "true")
    return "True";
  if (lit == "false")
    return "False";
  return lit;
}

const std::map<std::string, std::string>& binary_ops() {
  static const std::map<std::string, std::string> m = {
    {"add", "lax.add"}, {"add_any", "lax.add"}, {"sub", "lax.sub"}, {"mul", "lax.mul"},
    {"div", "lax.div"}, {"rem", "lax.rem"}, {"max", "lax.max"}, {"min", "lax.min"},
    {"pow", "lax.pow"}, {"atan2", "lax.atan2"}, {"nextafter", "lax.nextafter"},
    {"and", "lax.bitwise_and"}, {"or", "lax.bitwise_or"}, {"xor", "lax.bitwise_xor"},
    {"eq", "lax.eq"}, {"ne", "lax.ne"}, {"lt", "lax.lt"}, {"le", "lax.le"}, {"gt", "lax.gt"},
    {"ge", "lax.ge"}, {"eq_to", "lax.eq"}, {"lt_to", "lax.lt"}, {"le_to", "lax.le"},
    {"shift_left", "lax.shift_left"}, {"shift_right_logical", "lax.shift_right_logical"},
    {"shift_right_arithmetic", "lax.shift_right_arithmetic"},
  };
  return m;
}

const std::map<std::string, std::string>& unary_ops() {
  static const std::map<std::string, std::string> m = {
    {"neg", "lax.neg"}, {"sign", "lax.sign"}, {"floor", "lax.floor"}, {"ceil", "lax.ceil"},
    {"abs", "lax.abs"}, {"is_finite", "lax.is_finite"}, {"exp", "lax.exp"},
    {"exp2", "lax.exp2"}, {"log", "lax.log"}, {"log1p", "lax.log1p"}, {"expm1", "lax.expm1"},
    {"tanh", "lax.tanh"}, {"logistic", "lax.logistic"}, {"sin", "lax.sin"}, {"cos", "lax.cos"},
    {"tan", "lax.tan"}, {"asin", "lax.asin"}, {"acos", "lax.acos"}, {"atan", "lax.atan"},
    {"sinh", "lax.sinh"}, {"cosh", "lax.cosh"}, {"asinh", "lax.asinh"}, {"acosh", "lax.acosh"},
    {"atanh", "lax.atanh"}, {"sqrt", "lax.sqrt"}, {"rsqrt", "lax.rsqrt"}, {"cbrt", "lax.cbrt"},
    {"erf", "lax.erf"}, {"erfc", "lax.erfc"}, {"erf_inv", "lax.erf_inv"},
    {"square", "lax.square"}, {"not", "lax.bitwise_not"}, {"stop_gradient", ""},
    {"population_count", "lax.population_count"}, {"clz", "lax.clz"}, {"lgamma", "lax.lgamma"},
    {"digamma", "lax.digamma"}, {"copy", ""}, {"copy_p", ""}, {"optimization_barrier", ""},
    {"real", "lax.real"}, {"imag", "lax.imag"}, {"conj", "lax.conj"},
  };
  return m;
}

// Primitives whose result has its operands' shape (size-1 and rank-0 operands broadcast).
bool same_shape(const std::string& p) {
  return binary_ops().count(p) || unary_ops().count(p) || p == "integer_pow" || p == "round" ||
         p == "convert_element_type" || p == "reduce_precision" || p == "select_n" ||
         p == "clamp" || p == "cumsum" || p == "cumprod" || p == "cummax" || p == "cummin" ||
         p == "cumlogsumexp" || p == "rev";
}

// Union-find over the dims of graph inputs and node results.
class dim_classes {
public:
  explicit dim_classes(const graph_view& g) : g_(g) {
    for (unsigned k = 0; k < g.input_count(); ++k) {
      input_base_.push_back(static_cast<int>(size_.size()));
      for (auto s : g.input_type(k).getShape())
        size_.push_back(s);
    }
    for (unsigned n = 0; n < g.size(); ++n) {
      node_base_.emplace_back();
      for (auto r : g.node(static_cast<int>(n)).getResults()) {
        node_base_.back().push_back(static_cast<int>(size_.size()));
        for (auto s : r.getShape())
          size_.push_back(s);
      }
    }
    parent_.assign(size_.size(), -1);
    for (unsigned n = 0; n < g.size(); ++n)
      rules(static_cast<int>(n));
  }

  int slot(const value_ref& v, int axis) const {
    if (axis < 0)
      return -1;
    if (v.is_input() && v.id >= 0 && static_cast<size_t>(v.id) < input_base_.size()) {
      auto rank = g_.input_type(v.id).getShape().size();
      return static_cast<unsigned>(axis) < rank ? input_base_[v.id] + axis : -1;
    }
    if (v.is_node() && v.id >= 0 && static_cast<size_t>(v.id) < node_base_.size()) {
      auto results = g_.node(v.id).getResults();
      size_t r = v.result > 0 ? static_cast<size_t>(v.result) : 0;
      if (r >= results.size() || static_cast<unsigned>(axis) >= results[r].getShape().size())
        return -1;
      return node_base_[v.id][r] + axis;
    }
    return -1;
  }
  int find(int s) const {
    while (parent_[s] >= 0)
      s = parent_[s];
    return s;
  }
  int64_t size(int s) const { return size_[s]; }

private:
  void unite(int a, int b) {
    if (a < 0 || b < 0)
      return;
    a = find(a);
    b = find(b);
    if (a != b && size_[a] == size_[b])
      parent_[std::max(a, b)] = std::min(a, b);
  }
  int op(int n, unsigned k, int axis) const { return slot(g_.operand(n, k), axis); }

  void rules(int n) {
    const std::string p = g_.primitive(n);
    const auto& params = g_.params(n);
    auto node = g_.node(n);
    if (p == "split" && node.getResults().size() > 0) {
      // every result keeps the operand's dims but the split axis
      int axis = params.value("axis", 0);
      auto in = to_vector(node.getOperands()[0].getShape());
      for (unsigned r = 0; r < node.getResults().size(); ++r)
        for (int a = 0; a < static_cast<int>(in.size()); ++a)
          if (a != axis)
            unite(slot({value_ref::kind::node, n, "", static_cast<int>(r)}, a), op(n, 0, a));
      return;
    }
    if (node.getResults().size() != 1)
      return;
    auto out_shape = to_vector(node.getResults()[0].getShape());
    int rank = static_cast<int>(out_shape.size());
    value_ref self{value_ref::kind::node, n, ""};
    auto out = [&](int a) { return slot(self, a); };
    auto op_shape = [&](unsigned k) { return to_vector(node.getOperands()[k].getShape()); };
    if (same_shape(p)) {
      for (unsigned k = 0; k < node.getOperands().size(); ++k) {
        auto s = op_shape(k);
        if (static_cast<int>(s.size()) == rank)
          for (int a = 0; a < rank; ++a)
            if (s[a] == out_shape[a])
              unite(out(a), op(n, k, a));
      }
    } else if (p == "broadcast_in_dim") {
      auto bd = ints(params, "broadcast_dimensions");
      auto s = op_shape(0);
      for (size_t i = 0; i < bd.size() && i < s.size(); ++i)
        if (s[i] == out_shape[bd[i]])
          unite(out(static_cast<int>(bd[i])), op(n, 0, static_cast<int>(i)));
    } else if (p == "transpose") {
      auto perm = ints(params, "permutation");
      for (size_t a = 0; a < perm.size(); ++a)
        unite(out(static_cast<int>(a)), op(n, 0, static_cast<int>(perm[a])));
    } else if (p == "squeeze" || p.rfind("reduce_", 0) == 0 || p == "argmax" || p == "argmin") {
      if (p.rfind("reduce_window", 0) == 0) {
        auto win = ints(params, "window_dimensions"), st = ints(params, "window_strides");
        auto pad = pairs(params, "padding");
        for (int a = 0; a < rank && static_cast<size_t>(a) < win.size(); ++a)
          if (win[a] == 1 && st[a] == 1 && (pad.size() <= static_cast<size_t>(a) ||
                                            (pad[a].size() == 2 && !pad[a][0] && !pad[a][1])))
            unite(out(a), op(n, 0, a));
        return;
      }
      if (p == "reduce_precision")
        return;
      auto axes = ints(params, p == "squeeze" ? "dimensions" : "axes");
      auto s = op_shape(0);
      int a = 0;
      for (int i = 0; i < static_cast<int>(s.size()); ++i)
        if (std::find(axes.begin(), axes.end(), i) == axes.end())
          unite(out(a++), op(n, 0, i));
    } else if (p == "expand_dims") {
      auto dims = ints(params, "dimensions");
      int i = 0;
      for (int a = 0; a < rank; ++a)
        if (std::find(dims.begin(), dims.end(), a) == dims.end())
          unite(out(a), op(n, 0, i++));
    } else if (p == "dot_general") {
      auto lc = ints(params, "lhs_contracting"), rc = ints(params, "rhs_contracting");
      auto lb = ints(params, "lhs_batch"), rb = ints(params, "rhs_batch");
      for (size_t i = 0; i < lc.size() && i < rc.size(); ++i)
        unite(op(n, 0, static_cast<int>(lc[i])), op(n, 1, static_cast<int>(rc[i])));
      int a = 0;
      for (size_t i = 0; i < lb.size() && i < rb.size(); ++i) {
        unite(op(n, 0, static_cast<int>(lb[i])), op(n, 1, static_cast<int>(rb[i])));
        unite(out(a++), op(n, 0, static_cast<int>(lb[i])));
      }
      for (unsigned k = 0; k < 2; ++k) {
        const auto& c = k == 0 ? lc : rc;
        const auto& b = k == 0 ? lb : rb;
        for (int i = 0; i < static_cast<int>(op_shape(k).size()); ++i)
          if (std::find(c.begin(), c.end(), i) == c.end() &&
              std::find(b.begin(), b.end(), i) == b.end())
            unite(out(a++), op(n, k, i));
      }
    } else if (p == "conv_general_dilated") {
      auto dn = params.value("dimension_numbers", nlohmann::json::object());
      auto ls = ints(dn, "lhs_spec"), rs = ints(dn, "rhs_spec"), os = ints(dn, "out_spec");
      if (ls.size() >= 2 && rs.size() >= 2 && os.size() >= 2 &&
          params.value("batch_group_count", 1) == 1) {
        unite(out(static_cast<int>(os[0])), op(n, 0, static_cast<int>(ls[0])));
        unite(out(static_cast<int>(os[1])), op(n, 1, static_cast<int>(rs[0])));
      }
    } else if (p == "concatenate") {
      int dim = params.value("dimension", 0);
      for (unsigned k = 0; k < node.getOperands().size(); ++k)
        for (int a = 0; a < rank; ++a)
          if (a != dim)
            unite(out(a), op(n, k, a));
    } else if (p == "pad") {
      auto cfg = pairs(params, "padding_config");
      for (int a = 0; a < rank && static_cast<size_t>(a) < cfg.size(); ++a)
        if (cfg[a].size() == 3 && !cfg[a][0] && !cfg[a][1] && !cfg[a][2])
          unite(out(a), op(n, 0, a));
    } else if (p == "slice") {
      auto s = op_shape(0);
      for (int a = 0; a < rank && a < static_cast<int>(s.size()); ++a)
        if (s[a] == out_shape[a])
          unite(out(a), op(n, 0, a));
    } else if (p == "reshape") {
      // Dims in groups of equal products; one-to-one groups are the same dim.
      auto in = op_shape(0);
      size_t i = 0, j = 0;
      while (true) {
        while (i < in.size() && in[i] == 1)
          ++i;
        while (j < out_shape.size() && out_shape[j] == 1)
          ++j;
        if (i >= in.size() || j >= out_shape.size())
          break;
        size_t i0 = i, j0 = j;
        int64_t pi = in[i++], pj = out_shape[j++];
        while (pi != pj) {
          if (pi < pj && i < in.size())
            pi *= in[i++];
          else if (pj < pi && j < out_shape.size())
            pj *= out_shape[j++];
          else
            return;
        }
        int ni = 0, nj = 0, si = -1, sj = -1;
        for (size_t x = i0; x < i; ++x)
          if (in[x] != 1)
            ++ni, si = static_cast<int>(x);
        for (size_t y = j0; y < j; ++y)
          if (out_shape[y] != 1)
            ++nj, sj = static_cast<int>(y);
        if (ni == 1 && nj == 1)
          unite(out(sj), op(n, 0, si));
      }
    }
  }

  const graph_view& g_;
  std::vector<int> input_base_;
  std::vector<std::vector<int>> node_base_;  // per node, per result
  std::vector<int64_t> size_;
  std::vector<int> parent_;
};

bool is_float(const std::string& dtype) { return dtype.find("float") != std::string::npos; }

}  // namespace

std::string jnp_replay_code::code(int indent_spaces) const {
  std::string pad(static_cast<size_t>(indent_spaces), ' '), s;
  for (const auto& l : lines)
    s += pad + l + "\n";
  return s;
}

bool build_jnp_replay(const graph_view& graph, const jnp_replay_request& req,
                      jnp_replay_code& out, std::string& reason) {
  out = jnp_replay_code{};
  std::vector<char> need(graph.size(), 0);
  std::vector<int> stack;
  for (const auto& v : req.outputs)
    if (v.is_node() && !req.given.count(v.id))
      stack.push_back(v.id);
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    if (need[n])
      continue;
    need[n] = 1;
    for (unsigned k = 0; k < graph.operand_count(n); ++k) {
      auto v = graph.operand(n, k);
      if (v.is_node() && !req.given.count(v.id) && !need[v.id])
        stack.push_back(v.id);
    }
  }

  dim_classes dims(graph);
  std::map<int, std::string> rep;  // class root -> expression of a size that exists by now
  auto name_of = [&](const value_ref& v) -> std::string {
    if (v.is_input())
      return static_cast<size_t>(v.id) < req.inputs.size() ? req.inputs[v.id] : "";
    if (v.is_node()) {
      if (req.given.count(v.id))
        return req.given.at(v.id);
      std::string e = req.prefix + std::to_string(v.id);
      if (graph.node(v.id).getResults().size() != 1)  // a tuple: which result
        e += fmt::format("[{}]", std::max(v.result, 0));
      return e;
    }
    return "";
  };
  auto publish = [&](const value_ref& v) {
    auto shape = v.is_node() && v.result > 0
                     ? to_vector(graph.node(v.id).getResults()[v.result].getShape())
                     : graph.shape(v);
    auto e = name_of(v);
    for (size_t a = 0; a < shape.size(); ++a) {
      int s = dims.slot(v, static_cast<int>(a));
      if (s >= 0 && !rep.count(dims.find(s)))
        rep[dims.find(s)] = fmt::format("{}.shape[{}]", e, a);
    }
  };
  for (unsigned k = 0; k < graph.input_count() && k < req.inputs.size(); ++k)
    publish({value_ref::kind::input, static_cast<int>(k), ""});
  for (const auto& [id, e] : req.given)
    publish({value_ref::kind::node, id, ""});

  auto is_static = [&](int64_t size) {
    return std::find(req.static_ints.begin(), req.static_ints.end(), size) !=
           req.static_ints.end();
  };
  // Size of dim `axis` of `v`: "" when unknown at this point.
  auto size_expr = [&](const value_ref& v, int axis, int64_t size) -> std::string {
    int s = dims.slot(v, axis);
    if (s >= 0 && rep.count(dims.find(s)))
      return rep.at(dims.find(s));
    if (size == 1)
      return "1";
    if (is_static(size))
      return std::to_string(size);
    return "";
  };
  // Element count of reduce_sum node r (a product of its operand's reduced dims).
  auto count_of = [&](int r, std::string& e) -> int64_t {
    auto axes = ints(graph.params(r), "axes");
    auto src = graph.operand(r, 0);
    auto shape = graph.shape(src);
    int64_t c = 1;
    e.clear();
    for (auto a : axes) {
      if (a < 0 || static_cast<size_t>(a) >= shape.size())
        return -1;
      c *= shape[a];
      auto s = size_expr(src, static_cast<int>(a), shape[a]);
      if (s.empty())
        return -1;
      e += (e.empty() ? "" : " * ") + s;
    }
    e = "(" + (e.empty() ? std::string("1") : e) + ")";
    return c;
  };
  // The reduce_sum closest above node n (breadth first) whose count is `value`.
  auto count_literal = [&](int n, double value, std::string& e) -> bool {
    if (value < 2 || value != std::floor(value))
      return false;
    std::vector<int> frontier{n};
    std::set<int> seen;
    for (int depth = 0; depth < 8 && !frontier.empty(); ++depth) {
      std::vector<int> next;
      for (int x : frontier) {
        if (!seen.insert(x).second)
          continue;
        if (graph.primitive(x) == "reduce_sum") {
          std::string ce;
          if (count_of(x, ce) == static_cast<int64_t>(value)) {
            e = ce;
            return true;
          }
        }
        for (unsigned k = 0; k < graph.operand_count(x); ++k)
          if (graph.operand(x, k).is_node())
            next.push_back(graph.operand(x, k).id);
        for (int c : graph.consumers(x))
          next.push_back(c);
      }
      frontier = next;
    }
    return false;
  };

  auto operand = [&](int n, unsigned k, std::string& e) -> bool {
    auto v = graph.operand(n, k);
    auto type = graph.node(n).getOperands()[k];
    std::string dtype = type.getDtype().cStr();
    if (v.is_node() || v.is_input()) {
      if (v.is_node() && graph.node(v.id).getResults().size() != 1 && !req.given.count(v.id)) {
        // Which result: the summary's operandResults (a split's parts share a type).
        if (v.result < 0 ||
            static_cast<size_t>(v.result) >= graph.node(v.id).getResults().size()) {
          reason = fmt::format("node {} reads node {} ({}) of several results, not saying which",
                               n, v.id, graph.primitive(v.id));
          return false;
        }
      }
      e = name_of(v);
      if (e.empty()) {
        reason = fmt::format("node {} reads graph input {} that has no expression", n, v.id);
        return false;
      }
      return true;
    }
    if (v.is_literal()) {
      if (type.getShape().size() != 0) {
        reason = fmt::format("node {} ({}) has an array constant", n, graph.primitive(n));
        return false;
      }
      auto p = graph.primitive(n);
      auto parsed = nlohmann::json::parse(v.literal, nullptr, false);
      std::string ce;
      if (parsed.is_number() && is_float(dtype) && (p == "div" || p == "sub" || p == "mul")) {
        double x = parsed.get<double>();
        if (count_literal(n, x, ce)) {
          e = fmt::format("np.asarray({}, dtype={})", ce, py_dtype(dtype));
          return true;
        }
        if (p == "mul" && x > 0 && x < 0.5 && count_literal(n, std::round(1.0 / x), ce) &&
            std::abs(x * std::round(1.0 / x) - 1.0) < 1e-6) {
          e = fmt::format("np.asarray(1.0 / {}, dtype={})", ce, py_dtype(dtype));
          return true;
        }
      }
      e = fmt::format("np.asarray({}, dtype={})", literal_value(v.literal), py_dtype(dtype));
      return true;
    }
    reason = fmt::format("node {} ({}): operand {} is neither a value, an input nor a literal", n,
                         graph.primitive(n), k);
    return false;
  };

  for (unsigned id = 0; id < graph.size(); ++id) {
    int n = static_cast<int>(id);
    if (!need[n])
      continue;
    const std::string p = graph.primitive(n);
    const auto& params = graph.params(n);
    auto node = graph.node(n);
    if (graph.in_loop(n)) {
      reason = fmt::format("node {} ({}) runs in a loop body", n, p);
      return false;
    }
    std::vector<std::string> a(graph.operand_count(n));
    for (unsigned k = 0; k < a.size(); ++k)
      if (!operand(n, k, a[k]))
        return false;
    if (p == "split" && a.size() == 1 && node.getResults().size() > 0) {
      // Parts as sizes tied to the inputs; equal parts as a fraction of the split dim.
      int axis = params.value("axis", 0);
      auto in = to_vector(node.getOperands()[0].getShape());
      auto nres = node.getResults().size();
      if (axis < 0 || static_cast<size_t>(axis) >= in.size()) {
        reason = fmt::format("node {} (split): bad axis", n);
        return false;
      }
      std::string whole = size_expr(graph.operand(n, 0), axis, in[static_cast<size_t>(axis)]);
      std::string sizes;
      bool equal = true;
      int64_t first = node.getResults()[0].getShape()[static_cast<unsigned>(axis)];
      for (unsigned r = 0; r < nres; ++r)
        equal = equal && node.getResults()[r].getShape()[static_cast<unsigned>(axis)] == first;
      for (unsigned r = 0; r < nres; ++r) {
        int64_t part = node.getResults()[r].getShape()[static_cast<unsigned>(axis)];
        std::string e = size_expr({value_ref::kind::node, n, "", static_cast<int>(r)}, axis, part);
        if (e.empty() && equal && !whole.empty())
          e = fmt::format("{} // {}", whole, nres);
        if (e.empty()) {
          reason = fmt::format("node {} (split): a size is not tied to the inputs", n);
          return false;
        }
        sizes += e + ", ";
      }
      std::string res = req.prefix + std::to_string(n);
      out.lines.push_back(fmt::format("{} = lax.split({}, ({}), axis={})", res, a[0], sizes, axis));
      out.nodes.push_back(n);
      out.primitives.insert(p);
      for (unsigned r = 0; r < nres; ++r)
        publish({value_ref::kind::node, n, "", static_cast<int>(r)});
      continue;
    }
    if (node.getResults().size() != 1) {
      reason = fmt::format("node {} ({}) has several results", n, p);
      return false;
    }
    value_ref self{value_ref::kind::node, n, ""};
    auto out_shape = to_vector(node.getResults()[0].getShape());
    // The result's shape; a reshape may leave one unknown dim to -1.
    auto shape_of = [&](bool allow_minus_one, std::string& s) {
      std::vector<std::string> dims_e;
      int unknown = 0, last_static = -1;
      for (size_t ax = 0; ax < out_shape.size(); ++ax) {
        auto d = size_expr(self, static_cast<int>(ax), out_shape[ax]);
        int slot = dims.slot(self, static_cast<int>(ax));
        bool from_rep = slot >= 0 && rep.count(dims.find(slot));
        if (d.empty()) {
          d = "-1";
          ++unknown;
        } else if (!from_rep && d != "1") {
          last_static = static_cast<int>(ax);
        }
        dims_e.push_back(d);
      }
      // A split whose parts all equal a static count (C 64 -> 8 groups of 8): the group count
      // comes first, the last part is what the reshape derives.
      if (allow_minus_one && unknown == 0 && last_static >= 0)
        dims_e[static_cast<size_t>(last_static)] = "-1";
      s = "(";
      for (const auto& d : dims_e)
        s += d + ", ";
      s += ")";
      if (unknown > (allow_minus_one ? 1 : 0)) {
        reason = fmt::format("node {} ({}): a size of its result is not tied to the inputs", n, p);
        return false;
      }
      return true;
    };
    std::string e, s;
    if (binary_ops().count(p) && a.size() == 2) {
      e = fmt::format("{}({}, {})", binary_ops().at(p), a[0], a[1]);
    } else if (p == "div" || p == "add" || p == "sub" || p == "mul") {
      reason = fmt::format("node {} ({}) with {} operands", n, p, a.size());
      return false;
    } else if (unary_ops().count(p) && a.size() == 1) {
      const auto& f = unary_ops().at(p);
      e = f.empty() ? a[0] : fmt::format("{}({})", f, a[0]);
    } else if (p == "integer_pow") {
      e = fmt::format("lax.integer_pow({}, {})", a[0], params.value("y", 1));
    } else if (p == "round") {
      e = fmt::format("lax.round({}, lax.RoundingMethod.{})", a[0],
                      params.value("rounding_method", "AWAY_FROM_ZERO"));
    } else if (p == "convert_element_type") {
      e = fmt::format("lax.convert_element_type({}, {})", a[0],
                      py_dtype(params.value("new_dtype", "float32")));
    } else if (p == "reduce_precision") {
      e = fmt::format("lax.reduce_precision({}, {}, {})", a[0], params.value("exponent_bits", 8),
                      params.value("mantissa_bits", 23));
    } else if (p == "select_n" || p == "clamp") {
      std::string list;
      for (const auto& x : a)
        list += x + ", ";
      e = fmt::format("lax.{}(*jnp.broadcast_arrays({}))", p, list);
      if (p == "select_n" && node.getOperands()[0].getShape().size() == 0) {
        list.clear();
        for (size_t k = 1; k < a.size(); ++k)
          list += a[k] + ", ";
        e = fmt::format("lax.select_n({}, *jnp.broadcast_arrays({}))", a[0], list);
      }
    } else if (p == "broadcast_in_dim") {
      if (!shape_of(false, s))
        return false;
      e = fmt::format("lax.broadcast_in_dim({}, {}, {})", a[0], s,
                      tuple(ints(params, "broadcast_dimensions")));
    } else if (p == "reshape") {
      if (!shape_of(true, s))
        return false;
      e = fmt::format("jnp.reshape({}, {})", a[0], s);
    } else if (p == "squeeze") {
      e = fmt::format("lax.squeeze({}, {})", a[0], tuple(ints(params, "dimensions")));
    } else if (p == "expand_dims") {
      e = fmt::format("lax.expand_dims({}, {})", a[0], tuple(ints(params, "dimensions")));
    } else if (p == "transpose") {
      e = fmt::format("lax.transpose({}, {})", a[0], tuple(ints(params, "permutation")));
    } else if (p == "rev") {
      e = fmt::format("lax.rev({}, {})", a[0], tuple(ints(params, "dimensions")));
    } else if (p == "reduce_sum" || p == "reduce_max" || p == "reduce_min" ||
               p == "reduce_prod" || p == "reduce_and" || p == "reduce_or") {
      static const std::map<std::string, std::string> fn = {
        {"reduce_sum", "lax.add"}, {"reduce_max", "lax.max"}, {"reduce_min", "lax.min"},
        {"reduce_prod", "lax.mul"}, {"reduce_and", "lax.bitwise_and"},
        {"reduce_or", "lax.bitwise_or"}};
      static const std::map<std::string, std::string> init = {
        {"reduce_sum", "0"}, {"reduce_max", "-inf"}, {"reduce_min", "inf"}, {"reduce_prod", "1"},
        {"reduce_and", "True"}, {"reduce_or", "False"}};
      std::string dtype = node.getOperands()[0].getDtype().cStr();
      std::string i0 = init.at(p);
      std::string ie;
      if (dtype == "bool")
        ie = p == "reduce_and" || p == "reduce_min" ? "True" : "False";
      else if (i0 == "-inf" || i0 == "inf")
        ie = is_float(dtype) ? fmt::format("np.asarray(float('{}'), dtype={})", i0, py_dtype(dtype))
                             : fmt::format("np.asarray(jnp.iinfo({}).{}, dtype={})",
                                           py_dtype(dtype), i0 == "inf" ? "max" : "min",
                                           py_dtype(dtype));
      else
        ie = fmt::format("np.asarray({}, dtype={})", i0, py_dtype(dtype));
      e = fmt::format("lax.reduce({}, {}, {}, {})", a[0], ie, fn.at(p),
                      tuple(ints(params, "axes")));
    } else if (p == "argmax" || p == "argmin") {
      auto axes = ints(params, "axes");
      if (axes.size() != 1) {
        reason = fmt::format("node {} ({}) over several axes", n, p);
        return false;
      }
      e = fmt::format("lax.{}({}, {}, {})", p, a[0], axes[0],
                      py_dtype(params.value("index_dtype", "int32")));
    } else if (p == "cumsum" || p == "cumprod" || p == "cummax" || p == "cummin" ||
               p == "cumlogsumexp") {
      e = fmt::format("lax.{}({}, axis={}, reverse={})", p, a[0], params.value("axis", 0),
                      params.value("reverse", false) ? "True" : "False");
    } else if (p == "iota") {
      if (!shape_of(false, s))
        return false;
      e = fmt::format("lax.broadcasted_iota({}, {}, {})", py_dtype(params.value("dtype", "int32")),
                      s, params.value("dimension", 0));
    } else if (p == "dot_general") {
      auto pref = params.contains("preferred_element_type") &&
                          params["preferred_element_type"].is_string()
                      ? py_dtype(params["preferred_element_type"].get<std::string>()) : "None";
      e = fmt::format("lax.dot_general({}, {}, (({}, {}), ({}, {})), preferred_element_type={})",
                      a[0], a[1], tuple(ints(params, "lhs_contracting")),
                      tuple(ints(params, "rhs_contracting")), tuple(ints(params, "lhs_batch")),
                      tuple(ints(params, "rhs_batch")), pref);
    } else if (p == "reduce_window_max" || p == "reduce_window_min" || p == "reduce_window_sum") {
      std::string dtype = node.getOperands()[0].getDtype().cStr();
      std::string init = p == "reduce_window_sum" ? "0"
                         : p == "reduce_window_max" ? "float('-inf')" : "float('inf')";
      if (!is_float(dtype) && p != "reduce_window_sum")
        init = fmt::format("jnp.iinfo({}).{}", py_dtype(dtype),
                           p == "reduce_window_max" ? "min" : "max");
      std::string fn = p == "reduce_window_sum" ? "lax.add"
                       : p == "reduce_window_max" ? "lax.max" : "lax.min";
      auto base = ints(params, "base_dilation"), wdil = ints(params, "window_dilation");
      e = fmt::format("lax.reduce_window({}, np.asarray({}, dtype={}), {}, {}, {}, {}, {}, {})",
                      a[0], init, py_dtype(dtype), fn, tuple(ints(params, "window_dimensions")),
                      tuple(ints(params, "window_strides")),
                      tuple_of_pairs(pairs(params, "padding")),
                      base.empty() ? "None" : tuple(base), wdil.empty() ? "None" : tuple(wdil));
    } else if (p == "pad" && a.size() == 2) {
      e = fmt::format("lax.pad({}, {}, {})", a[0], a[1],
                      tuple_of_pairs(pairs(params, "padding_config")));
    } else if (p == "concatenate") {
      std::string list;
      for (const auto& x : a)
        list += x + ", ";
      e = fmt::format("lax.concatenate([{}], {})", list, params.value("dimension", 0));
    } else if (p == "conv_general_dilated" && a.size() == 2) {
      auto dn = params.value("dimension_numbers", nlohmann::json::object());
      auto pref = params.contains("preferred_element_type") &&
                          params["preferred_element_type"].is_string()
                      ? py_dtype(params["preferred_element_type"].get<std::string>()) : "None";
      e = fmt::format(
          "lax.conv_general_dilated({}, {}, {}, {}, {}, {}, lax.ConvDimensionNumbers({}, {}, {}), "
          "feature_group_count={}, batch_group_count={}, preferred_element_type={})",
          a[0], a[1], tuple(ints(params, "window_strides")),
          tuple_of_pairs(pairs(params, "padding")), tuple(ints(params, "lhs_dilation")),
          tuple(ints(params, "rhs_dilation")), tuple(ints(dn, "lhs_spec")),
          tuple(ints(dn, "rhs_spec")), tuple(ints(dn, "out_spec")),
          params.value("feature_group_count", 1), params.value("batch_group_count", 1), pref);
    } else {
      reason = fmt::format("node {} ({}) has no replay rule", n, p);
      return false;
    }
    std::string res = req.prefix + std::to_string(n);
    out.lines.push_back(fmt::format("{} = {}", res, e));
    out.nodes.push_back(n);
    out.primitives.insert(p);
    publish(self);
  }

  for (const auto& v : req.outputs) {
    auto e = name_of(v);
    if (e.empty() || (!v.is_node() && !v.is_input())) {
      reason = "an output is neither a node nor an input";
      return false;
    }
    out.outputs.push_back(e);
  }
  return true;
}

}  // namespace maxkernel::agents::expert
