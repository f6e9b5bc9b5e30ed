#include "agents/expert/dim_symbols.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>

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

// Primitives whose result has the operands' shape (rank-0 operands broadcast).
const std::set<std::string>& same_shape_primitives() {
  static const std::set<std::string> s = {
    "add", "add_any", "sub", "mul", "div", "rem", "max", "min", "pow", "atan2", "nextafter",
    "and", "or", "xor", "not", "eq", "ne", "lt", "le", "gt", "ge", "eq_to", "lt_to", "le_to",
    "neg", "sign", "floor", "ceil", "round", "abs", "is_finite", "exp", "exp2", "log",
    "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "cbrt", "erf", "erfc",
    "erf_inv", "square", "integer_pow", "stop_gradient", "convert_element_type",
    "reduce_precision", "copy", "copy_p", "select_n", "clamp", "shift_left",
    "shift_right_logical", "shift_right_arithmetic", "population_count", "clz", "imul",
    "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "rev", "sort", "custom_jvp_call",
    "optimization_barrier", "real", "imag", "conj", "copysign", "lgamma", "digamma",
    "reciprocal", "bitcast_convert_type",
  };
  return s;
}

}  // namespace

dim_symbols::dim_symbols(const graph_view& graph, std::vector<std::string> input_exprs)
    : graph_(graph), input_exprs_(std::move(input_exprs)) {
  for (unsigned k = 0; k < graph.input_count(); ++k) {
    input_base_.push_back(static_cast<int>(vars_.size()));
    auto shape = to_vector(graph.input_type(k).getShape());
    for (size_t a = 0; a < shape.size(); ++a) {
      var v;
      v.size = shape[a];
      v.input = static_cast<int>(k);
      v.axis = static_cast<int>(a);
      vars_.push_back(v);
      input_sizes_.push_back(shape[a]);
    }
  }
  node_base_.resize(graph.size());
  for (unsigned n = 0; n < graph.size(); ++n) {
    auto results = graph.node(static_cast<int>(n)).getResults();
    for (auto r : results) {
      node_base_[n].push_back(static_cast<int>(vars_.size()));
      for (auto s : r.getShape()) {
        var v;
        v.size = s;
        vars_.push_back(v);
      }
    }
  }
  for (unsigned n = 0; n < graph.size(); ++n)
    add_rules(static_cast<int>(n));
}

int dim_symbols::find(int v) const {
  while (vars_[v].parent >= 0) {
    int p = vars_[v].parent;
    if (vars_[p].parent >= 0)
      vars_[v].parent = vars_[p].parent;
    v = p;
  }
  return v;
}

void dim_symbols::unite(int a, int b) {
  if (a < 0 || b < 0)
    return;
  a = find(a);
  b = find(b);
  if (a == b || vars_[a].size != vars_[b].size)
    return;
  // The root keeps the lowest input dim (a deterministic choice of expression).
  auto rank = [&](int v) {
    return vars_[v].input >= 0 ? vars_[v].input * 64 + vars_[v].axis : 1 << 30;
  };
  if (rank(b) < rank(a))
    std::swap(a, b);
  vars_[b].parent = a;
  if (vars_[a].product.empty())
    vars_[a].product = vars_[b].product;
  if (vars_[a].frac_of < 0) {
    vars_[a].frac_of = vars_[b].frac_of;
    vars_[a].frac_num = vars_[b].frac_num;
    vars_[a].frac_den = vars_[b].frac_den;
  }
  vars_[a].literal_ok = vars_[a].literal_ok || vars_[b].literal_ok;
}

int dim_symbols::var_of(const value_ref& v, int axis, int result) const {
  if (axis < 0)
    return -1;
  if (v.is_input()) {
    if (v.id < 0 || static_cast<size_t>(v.id) >= input_base_.size())
      return -1;
    auto rank = graph_.input_type(v.id).getShape().size();
    return static_cast<unsigned>(axis) < rank ? input_base_[v.id] + axis : -1;
  }
  if (v.is_node()) {
    if (v.id < 0 || static_cast<size_t>(v.id) >= node_base_.size())
      return -1;
    const auto& bases = node_base_[v.id];
    if (result < 0 || static_cast<size_t>(result) >= bases.size())
      return -1;
    auto rank = graph_.node(v.id).getResults()[result].getShape().size();
    return static_cast<unsigned>(axis) < rank ? bases[result] + axis : -1;
  }
  return -1;
}

int dim_symbols::result_of_operand(int consumer, unsigned k) const {
  auto v = graph_.operand(consumer, k);
  if (!v.is_node())
    return 0;
  auto want = graph_.node(consumer).getOperands()[k];
  auto results = graph_.node(v.id).getResults();
  // The summary names the result (operandResults): exact even where several results share a
  // type (the halves of a split, top_k's values and indices of one dtype).
  if (v.result >= 0)
    return static_cast<size_t>(v.result) < results.size() ? v.result : -1;
  for (unsigned r = 0; r < results.size(); ++r)
    if (to_vector(results[r].getShape()) == to_vector(want.getShape()) &&
        std::string(results[r].getDtype().cStr()) == want.getDtype().cStr())
      return static_cast<int>(r);
  return -1;
}

int dim_symbols::operand_var(int node, unsigned k, int axis) const {
  auto v = graph_.operand(node, k);
  int r = result_of_operand(node, k);
  return r < 0 ? -1 : var_of(v, axis, r);
}

void dim_symbols::add_rules(int n) {
  const std::string p = graph_.primitive(n);
  const auto& params = graph_.params(n);
  auto node = graph_.node(n);
  auto results = node.getResults();
  auto operands = node.getOperands();
  if (results.size() == 0)
    return;
  value_ref self{value_ref::kind::node, n, ""};
  auto out_rank = static_cast<int>(results[0].getShape().size());
  auto op_rank = [&](unsigned k) { return static_cast<int>(operands[k].getShape().size()); };
  auto op_size = [&](unsigned k, int a) { return operands[k].getShape()[a]; };
  auto out = [&](int a, int r = 0) { return var_of(self, a, r); };

  if (same_shape_primitives().count(p)) {
    for (unsigned r = 0; r < results.size(); ++r)
      for (unsigned k = 0; k < operands.size(); ++k)
        if (op_rank(k) == out_rank)
          for (int a = 0; a < out_rank; ++a)
            unite(out(a, r), operand_var(n, k, a));
    return;
  }
  if (p == "broadcast_in_dim") {
    auto bd = ints(params, "broadcast_dimensions");
    for (size_t i = 0; i < bd.size() && static_cast<int>(i) < op_rank(0); ++i)
      unite(out(static_cast<int>(bd[i])), operand_var(n, 0, static_cast<int>(i)));
    return;
  }
  if (p == "transpose") {
    auto perm = ints(params, "permutation");
    for (size_t a = 0; a < perm.size(); ++a)
      unite(out(static_cast<int>(a)), operand_var(n, 0, static_cast<int>(perm[a])));
    return;
  }
  if (p == "squeeze") {
    auto dims = ints(params, "dimensions");
    int a = 0;
    for (int i = 0; i < op_rank(0); ++i)
      if (std::find(dims.begin(), dims.end(), i) == dims.end())
        unite(out(a++), operand_var(n, 0, i));
    return;
  }
  if (p.rfind("reduce_", 0) == 0 || p == "argmax" || p == "argmin") {
    auto axes = ints(params, "axes");
    int a = 0;
    for (int i = 0; i < op_rank(0); ++i)
      if (std::find(axes.begin(), axes.end(), i) == axes.end())
        unite(out(a++), operand_var(n, 0, i));
    return;
  }
  if (p == "dot_general") {
    auto lc = ints(params, "lhs_contracting"), rc = ints(params, "rhs_contracting");
    auto lb = ints(params, "lhs_batch"), rb = ints(params, "rhs_batch");
    for (size_t i = 0; i < lc.size() && i < rc.size(); ++i)
      unite(operand_var(n, 0, static_cast<int>(lc[i])), operand_var(n, 1, static_cast<int>(rc[i])));
    int a = 0;
    for (size_t i = 0; i < lb.size() && i < rb.size(); ++i) {
      unite(operand_var(n, 0, static_cast<int>(lb[i])), operand_var(n, 1, static_cast<int>(rb[i])));
      unite(out(a++), operand_var(n, 0, static_cast<int>(lb[i])));
    }
    for (unsigned k = 0; k < 2; ++k) {
      const auto& c = k == 0 ? lc : rc;
      const auto& b = k == 0 ? lb : rb;
      for (int i = 0; i < op_rank(k); ++i)
        if (std::find(c.begin(), c.end(), i) == c.end() && std::find(b.begin(), b.end(), i) == b.end())
          unite(out(a++), operand_var(n, k, i));
    }
    return;
  }
  if (p == "ragged_dot_general" && operands.size() >= 3 && op_rank(0) == 2 && op_rank(1) == 3) {
    // jax.lax.ragged_dot's layout: lhs (m, k), rhs (g, k, n), group sizes (g,)
    unite(operand_var(n, 1, 0), operand_var(n, 2, 0));
    if (op_size(1, 1) == op_size(0, 1)) {
      unite(operand_var(n, 0, 1), operand_var(n, 1, 1));
      unite(out(1), operand_var(n, 1, 2));
    } else {
      unite(operand_var(n, 0, 1), operand_var(n, 1, 2));
      unite(out(1), operand_var(n, 1, 1));
    }
    unite(out(0), operand_var(n, 0, 0));
    return;
  }
  if (p == "top_k") {
    int axis = params.contains("axis") && params["axis"].is_number_integer()
                   ? params["axis"].get<int>() : op_rank(0) - 1;
    if (axis < 0)
      axis += op_rank(0);
    for (unsigned r = 0; r < results.size(); ++r)
      for (int a = 0; a < op_rank(0); ++a) {
        if (a == axis)
          vars_[out(a, static_cast<int>(r))].literal_ok = true;
        else
          unite(out(a, static_cast<int>(r)), operand_var(n, 0, a));
      }
    if (results.size() > 1)
      unite(out(axis, 0), out(axis, 1));
    return;
  }
  if (p == "concatenate") {
    int dim = params.value("dimension", 0);
    for (unsigned k = 0; k < operands.size(); ++k)
      for (int a = 0; a < out_rank; ++a)
        if (a != dim && op_rank(k) == out_rank)
          unite(out(a), operand_var(n, k, a));
    return;
  }
  if (p == "slice" || p == "dynamic_slice") {
    auto lo = ints(params, "start_indices"), hi = ints(params, "limit_indices");
    auto sizes = ints(params, "slice_sizes");
    for (int a = 0; a < out_rank && a < op_rank(0); ++a) {
      if (results[0].getShape()[a] == op_size(0, a)) {
        unite(out(a), operand_var(n, 0, a));
        continue;
      }
      // a part of the operand's dim: a fraction of it (gate/up halves of a fused weight)
      int src = operand_var(n, 0, a);
      int64_t size = results[0].getShape()[a];
      if (src >= 0 && size > 0 && op_size(0, a) % size == 0 && op_size(0, a) / size <= 8) {
        int v = out(a);
        vars_[v].frac_of = src;
        vars_[v].frac_num = 1;
        vars_[v].frac_den = op_size(0, a) / size;
      }
      (void)lo; (void)hi; (void)sizes;
    }
    return;
  }
  if (p == "split") {
    int axis = params.value("axis", 0);
    for (unsigned r = 0; r < results.size(); ++r)
      for (int a = 0; a < out_rank; ++a) {
        int64_t size = results[r].getShape()[a];
        if (a != axis || size == op_size(0, a)) {
          unite(out(a, static_cast<int>(r)), operand_var(n, 0, a));
        } else if (size > 0 && op_size(0, a) % size == 0 && op_size(0, a) / size <= 8) {
          int v = out(a, static_cast<int>(r));
          vars_[v].frac_of = operand_var(n, 0, a);
          vars_[v].frac_den = op_size(0, a) / size;
        }
      }
    return;
  }
  if (p == "dynamic_update_slice" || p == "scatter" || p == "scatter-add" || p == "scatter_add" ||
      p == "scatter_mul" || p == "scatter_min" || p == "scatter_max" || p == "pad") {
    if (p != "pad")
      for (int a = 0; a < out_rank && a < op_rank(0); ++a)
        unite(out(a), operand_var(n, 0, a));
    if (p != "pad" && p != "dynamic_update_slice" && operands.size() >= 3) {
      // updates: scatter dims are the indices' batch dims (all but the last), window dims
      // the operand's dims that are not inserted, in order
      auto dn = params.value("dimension_numbers", nlohmann::json::object());
      auto window = ints(dn, "update_window_dims");
      auto inserted = ints(dn, "inserted_window_dims");
      auto obatch = ints(dn, "operand_batching_dims");
      std::vector<int> kept;
      for (int i = 0; i < op_rank(0); ++i)
        if (std::find(inserted.begin(), inserted.end(), i) == inserted.end() &&
            std::find(obatch.begin(), obatch.end(), i) == obatch.end())
          kept.push_back(i);
      int b = 0;
      size_t w = 0;
      for (int a = 0; a < op_rank(2); ++a) {
        if (std::find(window.begin(), window.end(), a) != window.end()) {
          if (w < kept.size() && op_size(2, a) == op_size(0, kept[w]))
            unite(operand_var(n, 2, a), operand_var(n, 0, kept[w]));
          ++w;
        } else {
          if (b < op_rank(1) - 1)
            unite(operand_var(n, 2, a), operand_var(n, 1, b));
          ++b;
        }
      }
    }
    return;
  }
  if (p == "gather" && operands.size() >= 2) {
    auto dn = params.value("dimension_numbers", nlohmann::json::object());
    auto offset_dims = ints(dn, "offset_dims");
    auto collapsed = ints(dn, "collapsed_slice_dims");
    auto obatch = ints(dn, "operand_batching_dims");
    auto slice_sizes = ints(params, "slice_sizes");
    // offset dims of the result take the operand's kept dims in order
    std::vector<int> kept;
    for (int i = 0; i < op_rank(0); ++i)
      if (std::find(collapsed.begin(), collapsed.end(), i) == collapsed.end() &&
          std::find(obatch.begin(), obatch.end(), i) == obatch.end())
        kept.push_back(i);
    for (size_t j = 0; j < offset_dims.size() && j < kept.size(); ++j)
      if (static_cast<size_t>(kept[j]) < slice_sizes.size() &&
          slice_sizes[kept[j]] == op_size(0, kept[j]))
        unite(out(static_cast<int>(offset_dims[j])), operand_var(n, 0, kept[j]));
    // the other dims of the result are the indices' batch dims (all but the last)
    int b = 0;
    for (int a = 0; a < out_rank; ++a)
      if (std::find(offset_dims.begin(), offset_dims.end(), a) == offset_dims.end()) {
        if (b < op_rank(1) - 1)
          unite(out(a), operand_var(n, 1, b));
        ++b;
      }
    return;
  }
  if (p == "reshape") {
    // Match the operand's and the result's dims in groups of equal products.
    auto in = to_vector(operands[0].getShape());
    auto res = to_vector(results[0].getShape());
    size_t i = 0, j = 0;
    while (i < in.size() || j < res.size()) {
      while (i < in.size() && in[i] == 1)
        ++i;
      while (j < res.size() && res[j] == 1)
        ++j;
      if (i >= in.size() || j >= res.size())
        break;
      size_t i0 = i, j0 = j;
      int64_t pi = in[i++], pj = res[j++];
      while (pi != pj) {
        if (pi < pj && i < in.size())
          pi *= in[i++];
        else if (pj < pi && j < res.size())
          pj *= res[j++];
        else
          return;
      }
      std::vector<int> ins, outs;
      for (size_t x = i0; x < i; ++x)
        if (in[x] != 1)
          ins.push_back(operand_var(n, 0, static_cast<int>(x)));
      for (size_t y = j0; y < j; ++y)
        if (res[y] != 1)
          outs.push_back(out(static_cast<int>(y)));
      if (ins.size() == 1 && outs.size() == 1) {
        unite(outs[0], ins[0]);
      } else if (outs.size() == 1) {
        vars_[outs[0]].product = ins;
      } else if (ins.size() == 1) {
        // a split: the operand's dim must be a known product with matching factors
        int root = find(ins[0]);
        const auto& prod = vars_[root].product;
        if (prod.size() == outs.size()) {
          bool same = true;
          for (size_t x = 0; x < prod.size(); ++x)
            same = same && vars_[prod[x]].size == vars_[outs[x]].size;
          if (same)
            for (size_t x = 0; x < prod.size(); ++x)
              unite(outs[x], prod[x]);
        }
      }
    }
    return;
  }
}

void dim_symbols::set_size_names(std::vector<std::vector<std::string>> names, bool by_value) {
  names_ = std::move(names);
  by_value_ = by_value;
}

bool dim_symbols::is_input_size(int64_t size) const {
  return std::find(input_sizes_.begin(), input_sizes_.end(), size) != input_sizes_.end();
}

std::string dim_symbols::expr_of(int v, int depth) const {
  if (v < 0 || depth > 16)
    return "";
  int r = find(v);
  const auto& x = vars_[r];
  if (x.input >= 0 && static_cast<size_t>(x.input) < input_exprs_.size())
    return fmt::format("{}.shape[{}]", input_exprs_[x.input], x.axis);
  if (x.size == 1)
    return "1";
  if (!x.product.empty()) {
    std::string e;
    for (int f : x.product) {
      auto s = expr_of(f, depth + 1);
      if (s.empty())
        return "";
      e += (e.empty() ? "" : " * ") + s;
    }
    return "(" + e + ")";
  }
  if (x.frac_of >= 0) {
    auto s = expr_of(x.frac_of, depth + 1);
    if (!s.empty())
      return x.frac_num == 1 ? fmt::format("({} // {})", s, x.frac_den)
                             : fmt::format("({} * {} // {})", s, x.frac_num, x.frac_den);
  }
  if (x.literal_ok || !is_input_size(x.size))
    return std::to_string(x.size);
  // the same size on input dims that reduce alike
  int first_input = -1, first_axis = -1;
  std::string name;
  bool same = true;
  for (size_t k = 0; k < input_base_.size(); ++k) {
    auto shape = to_vector(graph_.input_type(static_cast<unsigned>(k)).getShape());
    for (size_t a = 0; a < shape.size(); ++a) {
      if (shape[a] != x.size)
        continue;
      std::string n = k < names_.size() && a < names_[k].size() ? names_[k][a] : "";
      if (first_input < 0) {
        first_input = static_cast<int>(k);
        first_axis = static_cast<int>(a);
        name = n;
      } else if (n != name) {
        same = false;
      }
    }
  }
  if (first_input >= 0 && (by_value_ || (same && !name.empty())) &&
      static_cast<size_t>(first_input) < input_exprs_.size())
    return fmt::format("{}.shape[{}]", input_exprs_[first_input], first_axis);
  return "";
}

std::string dim_symbols::dim_expr(const value_ref& v, int axis, int result) const {
  return expr_of(var_of(v, axis, result), 0);
}

std::string dim_symbols::shape_expr(const value_ref& v, int result) const {
  std::vector<int64_t> shape;
  if (v.is_input())
    shape = to_vector(graph_.input_type(v.id).getShape());
  else if (v.is_node())
    shape = to_vector(graph_.node(v.id).getResults()[result].getShape());
  std::string e = "(";
  for (size_t a = 0; a < shape.size(); ++a) {
    auto d = dim_expr(v, static_cast<int>(a), result);
    if (d.empty())
      return "";
    e += d + ", ";
  }
  return e + ")";
}

std::string dim_symbols::bound_expr(const value_ref& v, int axis, int64_t bound, int result) const {
  int var = var_of(v, axis, result);
  if (var < 0)
    return "";
  int64_t size = vars_[var].size;
  if (bound == 0)
    return "0";
  auto d = expr_of(var, 0);
  if (bound == size)
    return d;
  if (!d.empty())
    for (int64_t q = 2; q <= 8; ++q)
      if ((bound * q) % size == 0) {
        int64_t p = bound * q / size;
        return p == 1 ? fmt::format("({} // {})", d, q) : fmt::format("({} * {} // {})", d, p, q);
      }
  return is_input_size(bound) ? "" : std::to_string(bound);
}

}  // namespace maxkernel::agents::expert::moe
