#include "agents/expert/index_evaluator.hpp"

#include "agents/expert/operand_trace.hpp"

#include <cmath>
#include <set>

namespace maxkernel::agents::expert::graph_facts {

namespace {

const std::set<std::string>& known() {
  static const std::set<std::string> k = {
      "iota", "broadcast_in_dim", "reshape", "convert_element_type", "copy", "copy_p",
      "add", "add_any", "sub", "mul", "div", "max", "min", "pow", "rem", "ge", "gt", "le", "lt",
      "eq", "ne", "and", "or", "xor", "not", "neg", "exp", "exp2", "log", "log1p", "expm1",
      "sqrt", "rsqrt", "abs", "sign", "floor", "ceil", "round", "tanh", "logistic", "square",
      "integer_pow", "sin", "cos", "select_n", "reduce_sum", "reduce_max", "reduce_min",
      "reduce_prod", "cumsum", "transpose", "squeeze", "expand_dims", "slice", "concatenate",
      "pad", "rev", "stop_gradient", "clamp", "optimization_barrier", "reduce_precision"};
  return k;
}

bool is_int(const std::string& dtype) {
  return dtype.find("int") != std::string::npos;
}

double cast_to(double v, const std::string& dtype) {
  if (dtype == "bool")
    return v != 0 ? 1.0 : 0.0;
  if (is_int(dtype))
    return std::trunc(v);
  if (dtype == "float32" || dtype == "bfloat16" || dtype == "float16")
    return static_cast<double>(static_cast<float>(v));
  return v;
}

std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    int64_t s = std::max<int64_t>(shape[i], 1);
    idx[i] = flat % s;
    flat /= s;
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t flat = 0;
  for (size_t i = 0; i < shape.size(); ++i)
    flat = flat * std::max<int64_t>(shape[i], 1) + idx[i];
  return flat;
}

}  // namespace

bool index_evaluator::index_only(const value_ref& v) {
  if (v.is_literal())
    return true;
  if (!v.is_node())
    return false;
  auto it = index_only_.find(v.id);
  if (it != index_only_.end())
    return it->second;
  index_only_[v.id] = false;  // cycles cannot happen; this guards deep recursion reentry
  bool ok = known().count(g_.primitive(v.id)) > 0;
  for (unsigned k = 0; ok && k < g_.operand_count(v.id); ++k)
    ok = index_only(g_.operand(v.id, k));
  index_only_[v.id] = ok;
  return ok;
}

std::optional<double> index_evaluator::at(const value_ref& v, const std::vector<int64_t>& index) {
  if (v.is_literal())
    return scalar_value(g_, v);
  if (!v.is_node())
    return std::nullopt;
  return node_at(v.id, index);
}

std::optional<double> index_evaluator::node_at(int id, const std::vector<int64_t>& index) {
  if (--budget_ < 0 || !index_only(value_ref{value_ref::kind::node, id, ""}))
    return std::nullopt;
  auto key = std::make_pair(id, index);
  if (auto it = memo_.find(key); it != memo_.end())
    return it->second;
  if (memo_.size() > 2'000'000)
    memo_.clear();
  auto p = g_.primitive(id);
  const auto& params = g_.params(id);
  auto shape = to_vector(g_.node(id).getResults()[0].getShape());
  std::string dtype = g_.node(id).getResults()[0].getDtype().cStr();
  auto operand = [&](unsigned k) { return g_.operand(id, k); };
  auto oshape = [&](unsigned k) { return g_.shape(operand(k)); };
  // An operand at the same index (elementwise ops; scalars broadcast).
  auto same = [&](unsigned k) -> std::optional<double> {
    auto o = operand(k);
    auto s = g_.shape(o);
    if (o.is_literal() || s.empty())
      return at(o, std::vector<int64_t>(s.size(), 0));
    return at(o, index);
  };
  std::optional<double> r;
  if (p == "iota") {
    auto dim = params.value("dimension", 0);
    if (dim >= 0 && static_cast<size_t>(dim) < index.size())
      r = static_cast<double>(index[static_cast<size_t>(dim)]);
  } else if (p == "broadcast_in_dim") {
    auto bd = params.value("broadcast_dimensions", std::vector<int>{});
    auto os = oshape(0);
    std::vector<int64_t> oi(os.size(), 0);
    bool ok = bd.size() == os.size();
    for (size_t i = 0; ok && i < os.size(); ++i)
      oi[i] = os[i] == 1 ? 0 : index[static_cast<size_t>(bd[i])];
    if (ok)
      r = at(operand(0), oi);
  } else if (p == "reshape" || p == "squeeze" || p == "expand_dims") {
    r = at(operand(0), unravel(ravel(index, shape), oshape(0)));
  } else if (p == "transpose") {
    auto perm = params.value("permutation", std::vector<int>{});
    std::vector<int64_t> oi(index.size());
    for (size_t i = 0; i < perm.size() && i < index.size(); ++i)
      oi[static_cast<size_t>(perm[i])] = index[i];
    r = at(operand(0), oi);
  } else if (p == "convert_element_type" || p == "copy" || p == "copy_p" ||
             p == "stop_gradient" || p == "optimization_barrier" || p == "reduce_precision") {
    if (auto x = same(0))
      r = cast_to(*x, dtype);
  } else if (p == "select_n") {
    if (auto c = same(0)) {
      auto k = static_cast<unsigned>(*c);
      if (k + 1 < g_.operand_count(id))
        r = same(k + 1);
    }
  } else if (p == "clamp") {
    auto lo = same(0), x = same(1), hi = same(2);
    if (lo && x && hi)
      r = std::min(std::max(*x, *lo), *hi);
  } else if (p == "reduce_sum" || p == "reduce_max" || p == "reduce_min" || p == "reduce_prod") {
    auto axes = params.value("axes", std::vector<int>{});
    auto os = oshape(0);
    std::vector<int64_t> oi;
    // result index -> operand index with the reduced axes free
    size_t ri = 0;
    std::vector<bool> red(os.size(), false);
    for (int a : axes)
      if (a >= 0 && static_cast<size_t>(a) < os.size())
        red[static_cast<size_t>(a)] = true;
    oi.assign(os.size(), 0);
    std::vector<int64_t> rshape;
    for (size_t i = 0; i < os.size(); ++i)
      if (red[i])
        rshape.push_back(os[i]);
      else
        oi[i] = index[ri++];
    int64_t n = 1;
    for (auto s : rshape)
      n *= s;
    double acc = p == "reduce_sum" ? 0.0 : p == "reduce_prod" ? 1.0
               : p == "reduce_max" ? -INFINITY : INFINITY;
    bool ok = true;
    for (int64_t f = 0; ok && f < n; ++f) {
      auto sub = unravel(f, rshape);
      size_t si = 0;
      for (size_t i = 0; i < os.size(); ++i)
        if (red[i])
          oi[i] = sub[si++];
      auto x = at(operand(0), oi);
      if (!x) {
        ok = false;
        break;
      }
      if (p == "reduce_sum")
        acc += *x;
      else if (p == "reduce_prod")
        acc *= *x;
      else if (p == "reduce_max")
        acc = std::max(acc, *x);
      else
        acc = std::min(acc, *x);
      acc = cast_to(acc, dtype);
    }
    if (ok)
      r = acc;
  } else if (p == "cumsum") {
    auto axis = static_cast<size_t>(params.value("axis", 0));
    bool reverse = params.value("reverse", false);
    if (axis < index.size()) {
      double acc = 0;
      auto oi = index;
      int64_t lo = reverse ? index[axis] : 0, hi = reverse ? shape[axis] - 1 : index[axis];
      bool ok = true;
      for (int64_t j = lo; ok && j <= hi; ++j) {
        oi[axis] = j;
        auto x = at(operand(0), oi);
        ok = x.has_value();
        if (ok)
          acc = cast_to(acc + *x, dtype);
      }
      if (ok)
        r = acc;
    }
  } else if (p == "slice") {
    auto start = params.value("start_indices", std::vector<int64_t>{});
    auto strides = params.value("strides", nlohmann::json());
    std::vector<int64_t> oi(index.size());
    for (size_t i = 0; i < index.size() && i < start.size(); ++i) {
      int64_t st = strides.is_array() && i < strides.size() ? strides[i].get<int64_t>() : 1;
      oi[i] = start[i] + index[i] * st;
    }
    r = at(operand(0), oi);
  } else if (p == "concatenate") {
    auto dim = static_cast<size_t>(params.value("dimension", 0));
    int64_t off = 0;
    for (unsigned k = 0; k < g_.operand_count(id); ++k) {
      auto s = oshape(k);
      if (dim < s.size() && index[dim] < off + s[dim]) {
        auto oi = index;
        oi[dim] -= off;
        r = at(operand(k), oi);
        break;
      }
      if (dim < s.size())
        off += s[dim];
    }
  } else if (p == "pad") {
    auto cfg = params.value("padding_config", nlohmann::json::array());
    auto os = oshape(0);
    std::vector<int64_t> oi(index.size());
    bool inside = cfg.size() == index.size();
    for (size_t i = 0; inside && i < index.size(); ++i) {
      int64_t lo = cfg[i][0], interior = cfg[i][2];
      int64_t x = index[i] - lo;
      if (x < 0 || x % (interior + 1) != 0 || x / (interior + 1) >= os[i])
        inside = false;
      else
        oi[i] = x / (interior + 1);
    }
    r = inside ? at(operand(0), oi) : at(operand(1), {});
  } else if (p == "rev") {
    auto dims = params.value("dimensions", std::vector<int>{});
    auto oi = index;
    for (int d : dims)
      oi[static_cast<size_t>(d)] = shape[static_cast<size_t>(d)] - 1 - index[static_cast<size_t>(d)];
    r = at(operand(0), oi);
  } else if (g_.operand_count(id) == 1) {
    auto x = same(0);
    if (x) {
      double a = *x;
      if (p == "neg") r = -a;
      else if (p == "exp") r = std::exp(a);
      else if (p == "exp2") r = std::exp2(a);
      else if (p == "log") r = std::log(a);
      else if (p == "log1p") r = std::log1p(a);
      else if (p == "expm1") r = std::expm1(a);
      else if (p == "sqrt") r = std::sqrt(a);
      else if (p == "rsqrt") r = 1.0 / std::sqrt(a);
      else if (p == "abs") r = std::fabs(a);
      else if (p == "sign") r = a > 0 ? 1.0 : a < 0 ? -1.0 : 0.0;
      else if (p == "floor") r = std::floor(a);
      else if (p == "ceil") r = std::ceil(a);
      else if (p == "round") r = std::round(a);
      else if (p == "tanh") r = std::tanh(a);
      else if (p == "logistic") r = 1.0 / (1.0 + std::exp(-a));
      else if (p == "square") r = a * a;
      else if (p == "sin") r = std::sin(a);
      else if (p == "cos") r = std::cos(a);
      else if (p == "integer_pow") r = std::pow(a, params.value("y", 1));
      else if (p == "not") r = dtype == "bool" ? (a != 0 ? 0.0 : 1.0)
                                               : static_cast<double>(~static_cast<int64_t>(a));
      if (r)
        r = cast_to(*r, dtype);
    }
  } else if (g_.operand_count(id) == 2) {
    auto x = same(0), y = same(1);
    if (x && y) {
      double a = *x, b = *y;
      bool ints = is_int(dtype);
      if (p == "add" || p == "add_any") r = a + b;
      else if (p == "sub") r = a - b;
      else if (p == "mul") r = a * b;
      else if (p == "div") r = ints ? (b != 0 ? std::trunc(a / b) : 0.0) : a / b;
      else if (p == "rem") r = std::fmod(a, b);
      else if (p == "max") r = std::max(a, b);
      else if (p == "min") r = std::min(a, b);
      else if (p == "pow") r = std::pow(a, b);
      else if (p == "ge") r = a >= b;
      else if (p == "gt") r = a > b;
      else if (p == "le") r = a <= b;
      else if (p == "lt") r = a < b;
      else if (p == "eq") r = a == b;
      else if (p == "ne") r = a != b;
      else if (p == "and") r = dtype == "bool" ? double((a != 0) && (b != 0))
                                               : double(static_cast<int64_t>(a) & static_cast<int64_t>(b));
      else if (p == "or") r = dtype == "bool" ? double((a != 0) || (b != 0))
                                              : double(static_cast<int64_t>(a) | static_cast<int64_t>(b));
      else if (p == "xor") r = dtype == "bool" ? double((a != 0) != (b != 0))
                                               : double(static_cast<int64_t>(a) ^ static_cast<int64_t>(b));
      if (r)
        r = cast_to(*r, dtype);
    }
  }
  memo_[key] = r;
  return r;
}

}  // namespace maxkernel::agents::expert::graph_facts
