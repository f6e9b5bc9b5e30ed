#include "agents/expert/loop_index_space.hpp"

#include <algorithm>
#include <set>

namespace maxkernel::agents::expert {

int loop_index_space::make(int64_t size) {
  indices_.push_back({size, {}});
  return count() - 1;
}

bool loop_index_space::refine(int id, int64_t major) {
  auto& ix = indices_[static_cast<size_t>(id)];
  if (!ix.children.empty() || major <= 1 || major >= ix.size || ix.size % major != 0)
    return false;
  int64_t minor = ix.size / major;
  int a = make(major);
  int b = make(minor);
  indices_[static_cast<size_t>(id)].children = {a, b};
  return true;
}

index_list loop_index_space::expand(const index_list& ids) const {
  index_list out;
  for (int id : ids) {
    const auto& ix = indices_[static_cast<size_t>(id)];
    if (ix.children.empty()) {
      out.push_back(id);
    } else {
      auto sub = expand(ix.children);
      out.insert(out.end(), sub.begin(), sub.end());
    }
  }
  return out;
}

axis_indices loop_index_space::expand(const axis_indices& axes) const {
  axis_indices out;
  out.reserve(axes.size());
  for (const auto& a : axes)
    out.push_back(expand(a));
  return out;
}

int64_t loop_index_space::product(const index_list& ids) const {
  int64_t p = 1;
  for (int id : expand(ids))
    p *= size(id);
  return p;
}

bool loop_index_space::partition(const index_list& seq_in, const std::vector<int64_t>& sizes,
                                 axis_indices& groups) {
  index_list seq = expand(seq_in);
  groups.assign(sizes.size(), {});
  size_t pos = 0;
  for (size_t a = 0; a < sizes.size(); ++a) {
    int64_t target = sizes[a];
    if (target <= 0)
      return false;
    int64_t prod = 1;
    while (prod < target) {
      if (pos >= seq.size())
        return false;
      int leaf = seq[pos];
      int64_t s = size(leaf);
      if (target % (prod * s) == 0) {
        groups[a].push_back(leaf);
        prod *= s;
        ++pos;
        continue;
      }
      // the boundary falls inside this index: split it
      if (target % prod != 0)
        return false;
      int64_t need = target / prod;
      if (s % need != 0 || !refine(leaf, need))
        return false;
      auto children = expand(index_list{leaf});
      seq.erase(seq.begin() + static_cast<long>(pos));
      seq.insert(seq.begin() + static_cast<long>(pos), children.begin(), children.end());
    }
    if (prod != target)
      return false;
  }
  return pos == seq.size();
}

bool is_layout_primitive(const std::string& p) {
  static const std::set<std::string> layout = {"reshape", "transpose", "broadcast_in_dim",
                                               "squeeze", "expand_dims"};
  return layout.count(p) > 0;
}

bool is_elementwise_primitive(const std::string& p) {
  static const std::set<std::string> ew = {
    "add", "add_any", "sub", "mul", "div", "rem", "max", "min", "neg", "sign", "floor", "ceil",
    "round", "abs", "and", "or", "xor", "not", "eq", "ne", "lt", "le", "gt", "ge", "select_n",
    "clamp", "nextafter", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "square", "is_finite", "copysign", "convert_element_type", "reduce_precision", "exp",
    "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "erfc", "rsqrt", "sqrt", "cbrt",
    "sin", "cos", "tan", "atan2", "pow", "integer_pow", "stop_gradient", "copy", "copy_p",
    "reciprocal", "erf_inv", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan",
    "optimization_barrier"};
  return ew.count(p) > 0;
}

namespace {

std::vector<int64_t> result_shape(const graph_view& g, int node) {
  value_ref v;
  v.what = value_ref::kind::node;
  v.id = node;
  return g.shape(v);
}

std::vector<int64_t> operand_shape(const graph_view& g, int node, unsigned k) {
  return to_vector(g.node(node).getOperands()[k].getShape());
}

std::vector<int> int_list(const nlohmann::json& j) {
  std::vector<int> out;
  if (j.is_array())
    for (const auto& x : j)
      if (x.is_number_integer())
        out.push_back(x.get<int>());
  return out;
}

bool params_null_or_missing(const nlohmann::json& p, const char* key) {
  return !p.contains(key) || p[key].is_null();
}

}  // namespace

bool is_constant_scalar(const graph_view& g, const value_ref& v) {
  if (v.is_literal())
    return true;
  if (!v.is_node())
    return false;
  auto shape = g.shape(v);
  if (!shape.empty())
    return false;
  auto p = g.primitive(v.id);
  if (!is_elementwise_primitive(p))
    return false;
  for (unsigned k = 0; k < g.operand_count(v.id); ++k)
    if (!is_constant_scalar(g, g.operand(v.id, k)))
      return false;
  return true;
}

value_ref constant_scalar_behind(const graph_view& g, const value_ref& v) {
  value_ref cur = v;
  while (cur.is_node()) {
    if (is_constant_scalar(g, cur))
      return cur;
    auto p = g.primitive(cur.id);
    if (p == "broadcast_in_dim" || p == "reshape" || p == "convert_element_type" ||
        p == "expand_dims" || p == "squeeze") {
      cur = g.operand(cur.id, 0);
      continue;
    }
    break;
  }
  if (cur.is_literal())
    return cur;
  return {};
}

std::optional<axis_indices> operand_indices(const graph_view& g, loop_index_space& space,
                                            int node, unsigned k, const axis_indices& result) {
  auto p = g.primitive(node);
  const auto& params = g.params(node);
  auto rshape = result_shape(g, node);
  auto oshape = operand_shape(g, node, k);
  axis_indices res = space.expand(result);
  if (res.size() != rshape.size())
    return std::nullopt;
  if (is_elementwise_primitive(p)) {
    if (oshape.empty())
      return axis_indices{};
    if (oshape.size() != rshape.size())
      return std::nullopt;
    // size-1 operand axes broadcast against the result (lax's implicit rank-preserving
    // broadcasting in comparisons of [S, 1] and [1, S] positions)
    axis_indices out(oshape.size());
    for (size_t a = 0; a < oshape.size(); ++a) {
      if (oshape[a] == rshape[a])
        out[a] = res[a];
      else if (oshape[a] != 1)
        return std::nullopt;
    }
    return out;
  }
  if (p == "transpose") {
    auto perm = int_list(params.value("permutation", nlohmann::json()));
    if (perm.size() != rshape.size())
      return std::nullopt;
    axis_indices out(oshape.size());
    for (size_t i = 0; i < perm.size(); ++i)
      out[static_cast<size_t>(perm[i])] = res[i];
    return out;
  }
  if (p == "broadcast_in_dim") {
    auto bd = int_list(params.value("broadcast_dimensions", nlohmann::json()));
    if (bd.size() != oshape.size())
      return std::nullopt;
    axis_indices out(oshape.size());
    for (size_t j = 0; j < bd.size(); ++j) {
      auto r = static_cast<size_t>(bd[j]);
      if (r >= rshape.size())
        return std::nullopt;
      if (oshape[j] == rshape[r])
        out[j] = res[r];
      else if (oshape[j] != 1)
        return std::nullopt;
    }
    return out;
  }
  if (p == "reshape" || p == "squeeze" || p == "expand_dims") {
    if (p == "reshape" && !params_null_or_missing(params, "dimensions"))
      return std::nullopt;
    index_list seq;
    for (const auto& a : res)
      seq.insert(seq.end(), a.begin(), a.end());
    std::vector<int64_t> sizes;
    for (auto s : oshape)
      sizes.push_back(s == 1 ? 1 : s);
    axis_indices out;
    // unit axes of the operand take no index: partition over the non-unit ones
    std::vector<int64_t> nonunit;
    for (auto s : sizes)
      if (s != 1)
        nonunit.push_back(s);
    axis_indices groups;
    if (!space.partition(seq, nonunit, groups))
      return std::nullopt;
    size_t gi = 0;
    for (auto s : sizes)
      out.push_back(s == 1 ? index_list{} : groups[gi++]);
    return out;
  }
  return std::nullopt;
}

std::optional<axis_indices> result_indices(const graph_view& g, loop_index_space& space,
                                           int node, unsigned k,
                                           const axis_indices& operand_axes) {
  auto p = g.primitive(node);
  const auto& params = g.params(node);
  auto rshape = result_shape(g, node);
  auto oshape = operand_shape(g, node, k);
  axis_indices ops = space.expand(operand_axes);
  if (ops.size() != oshape.size())
    return std::nullopt;
  if (is_elementwise_primitive(p)) {
    if (oshape != rshape)
      return std::nullopt;
    return ops;
  }
  if (p == "transpose") {
    auto perm = int_list(params.value("permutation", nlohmann::json()));
    if (perm.size() != rshape.size())
      return std::nullopt;
    axis_indices out(rshape.size());
    for (size_t i = 0; i < perm.size(); ++i)
      out[i] = ops[static_cast<size_t>(perm[i])];
    return out;
  }
  if (p == "reshape" || p == "squeeze" || p == "expand_dims") {
    if (p == "reshape" && !params_null_or_missing(params, "dimensions"))
      return std::nullopt;
    index_list seq;
    for (const auto& a : ops)
      seq.insert(seq.end(), a.begin(), a.end());
    std::vector<int64_t> nonunit;
    for (auto s : rshape)
      if (s != 1)
        nonunit.push_back(s);
    axis_indices groups;
    if (!space.partition(seq, nonunit, groups))
      return std::nullopt;
    axis_indices out;
    size_t gi = 0;
    for (auto s : rshape)
      out.push_back(s == 1 ? index_list{} : groups[gi++]);
    return out;
  }
  return std::nullopt;
}

std::optional<traced_operand> trace_back(const graph_view& g, loop_index_space& space,
                                         value_ref v, axis_indices axes) {
  traced_operand t;
  std::vector<int> preops_rev;
  while (v.is_node()) {
    int id = v.id;
    auto p = g.primitive(id);
    if (g.in_loop(id))
      break;
    if (is_layout_primitive(p)) {
      auto ops = operand_indices(g, space, id, 0, axes);
      if (!ops)
        return std::nullopt;
      t.layout.push_back(id);
      axes = *ops;
      v = g.operand(id, 0);
      continue;
    }
    if (p == "stop_gradient" || p == "copy" || p == "copy_p" || p == "optimization_barrier") {
      v = g.operand(id, 0);
      continue;
    }
    if (p == "convert_element_type" || p == "reduce_precision") {
      preops_rev.push_back(id);
      v = g.operand(id, 0);
      continue;
    }
    if (is_elementwise_primitive(p) && p != "select_n") {
      // one tensor operand, the others constant scalars (or broadcasts of them)
      int tensor = -1;
      bool ok = true;
      for (unsigned k = 0; k < g.operand_count(id); ++k) {
        auto o = g.operand(id, k);
        if (is_constant_scalar(g, o) || constant_scalar_behind(g, o).what != value_ref::kind::unknown)
          continue;
        if (tensor >= 0) {
          ok = false;
          break;
        }
        tensor = static_cast<int>(k);
      }
      if (ok && tensor >= 0) {
        auto ops = operand_indices(g, space, id, static_cast<unsigned>(tensor), axes);
        if (!ops)
          return std::nullopt;
        preops_rev.push_back(id);
        axes = *ops;
        v = g.operand(id, static_cast<unsigned>(tensor));
        continue;
      }
    }
    break;
  }
  if (!v.is_node() && !v.is_input())
    return std::nullopt;
  t.base = v;
  t.axes = space.expand(axes);
  t.preops.assign(preops_rev.rbegin(), preops_rev.rend());
  return t;
}

bool dot_operand_indices(const graph_view& g, loop_index_space& space, int dot,
                         const axis_indices& result_in, axis_indices& lhs, axis_indices& rhs,
                         index_list& contracting) {
  const auto& params = g.params(dot);
  auto lc = int_list(params.value("lhs_contracting", nlohmann::json()));
  auto rc = int_list(params.value("rhs_contracting", nlohmann::json()));
  auto lb = int_list(params.value("lhs_batch", nlohmann::json()));
  auto rb = int_list(params.value("rhs_batch", nlohmann::json()));
  auto ls = operand_shape(g, dot, 0);
  auto rs = operand_shape(g, dot, 1);
  auto result = space.expand(result_in);
  if (lc.size() != rc.size() || lb.size() != rb.size())
    return false;
  lhs.assign(ls.size(), {});
  rhs.assign(rs.size(), {});
  size_t r = 0;
  for (size_t i = 0; i < lb.size(); ++i, ++r) {
    if (r >= result.size())
      return false;
    lhs[static_cast<size_t>(lb[i])] = result[r];
    rhs[static_cast<size_t>(rb[i])] = result[r];
  }
  auto in = [](const std::vector<int>& v, int x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  for (size_t a = 0; a < ls.size(); ++a)
    if (!in(lc, static_cast<int>(a)) && !in(lb, static_cast<int>(a))) {
      if (r >= result.size())
        return false;
      lhs[a] = result[r++];
    }
  for (size_t a = 0; a < rs.size(); ++a)
    if (!in(rc, static_cast<int>(a)) && !in(rb, static_cast<int>(a))) {
      if (r >= result.size())
        return false;
      rhs[a] = result[r++];
    }
  if (r != result.size())
    return false;
  contracting.clear();
  for (size_t i = 0; i < lc.size(); ++i) {
    auto l = static_cast<size_t>(lc[i]);
    auto rr = static_cast<size_t>(rc[i]);
    if (ls[l] != rs[rr])
      return false;
    if (ls[l] == 1)
      continue;
    int id = space.make(ls[l]);
    lhs[l] = {id};
    rhs[rr] = {id};
    contracting.push_back(id);
  }
  return true;
}

axis_indices fresh_indices(loop_index_space& space, const std::vector<int64_t>& shape) {
  axis_indices out;
  for (auto s : shape)
    out.push_back(s == 1 ? index_list{} : index_list{space.make(s)});
  return out;
}

}  // namespace maxkernel::agents::expert
