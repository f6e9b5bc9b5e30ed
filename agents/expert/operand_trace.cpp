#include "agents/expert/operand_trace.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace maxkernel::agents::expert {

int dtype_bytes(const std::string& dtype) {
  if (dtype == "bfloat16" || dtype == "float16" || dtype == "int16" || dtype == "uint16")
    return 2;
  if (dtype == "int8" || dtype == "uint8" || dtype == "bool" || dtype.rfind("float8", 0) == 0)
    return 1;
  if (dtype == "float64" || dtype == "int64" || dtype == "uint64")
    return 8;
  return 4;
}

bool is_float_dtype(const std::string& dtype) {
  return dtype.find("float") != std::string::npos;
}

std::optional<double> scalar_value(const graph_view& graph, const value_ref& v) {
  if (v.is_literal()) {
    auto j = nlohmann::json::parse(v.literal, nullptr, false);
    if (j.is_number())
      return j.get<double>();
    if (j.is_boolean())
      return j.get<bool>() ? 1.0 : 0.0;
    if (j.is_string()) {
      auto s = j.get<std::string>();
      if (s == "inf")
        return INFINITY;
      if (s == "-inf")
        return -INFINITY;
      if (s == "nan")
        return NAN;
    }
    return std::nullopt;
  }
  if (!v.is_node())
    return std::nullopt;
  auto p = graph.primitive(v.id);
  // arithmetic on scalars alone (jnp.sqrt(128.0), 1 / x, head_dim ** -0.5 traced as ops)
  if (graph.shape(v).empty() && graph.operand_count(v.id) >= 1 && graph.operand_count(v.id) <= 2) {
    auto a = scalar_value(graph, graph.operand(v.id, 0));
    std::optional<double> b;
    if (graph.operand_count(v.id) == 2)
      b = scalar_value(graph, graph.operand(v.id, 1));
    if (a && graph.operand_count(v.id) == 1) {
      if (p == "sqrt") return std::sqrt(*a);
      if (p == "rsqrt") return 1.0 / std::sqrt(*a);
      if (p == "exp") return std::exp(*a);
      if (p == "log") return std::log(*a);
      if (p == "neg") return -*a;
      if (p == "integer_pow") return std::pow(*a, graph.params(v.id).value("y", 1));
    }
    if (a && b) {
      if (p == "mul") return *a * *b;
      if (p == "div") return *a / *b;
      if (p == "add") return *a + *b;
      if (p == "sub") return *a - *b;
      if (p == "pow") return std::pow(*a, *b);
      if (p == "max") return std::max(*a, *b);
      if (p == "min") return std::min(*a, *b);
    }
  }
  if ((p == "broadcast_in_dim" || p == "convert_element_type" || p == "reshape" ||
       p == "copy") &&
      graph.operand_count(v.id) >= 1) {
    auto in = graph.operand(v.id, 0);
    if (graph.shape(in).empty() || in.is_literal())
      return scalar_value(graph, in);
    // a reshape/broadcast of a one-element array
    auto s = graph.shape(in);
    int64_t n = std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
    if (n == 1)
      return scalar_value(graph, in);
  }
  return std::nullopt;
}

namespace {

// The narrower of two float dtypes (by bytes); non-floats do not count.
std::string narrower(const std::string& a, const std::string& b) {
  if (!is_float_dtype(b))
    return a;
  if (a.empty() || !is_float_dtype(a))
    return b;
  return dtype_bytes(b) < dtype_bytes(a) ? b : a;
}

}  // namespace

operand_trace trace_operand(const graph_view& graph, const value_ref& start) {
  operand_trace t;
  value_ref v = start;
  auto rank = graph.shape(v).size();
  t.dims.resize(rank);
  std::iota(t.dims.begin(), t.dims.end(), 0);
  t.narrowest = graph.dtype(v);
  while (v.is_node()) {
    auto p = graph.primitive(v.id);
    if (p == "convert_element_type" || p == "copy" || p == "copy_p" ||
        p == "optimization_barrier" || p == "reduce_precision") {
      v = graph.operand(v.id, 0);
      t.narrowest = narrower(t.narrowest, graph.dtype(v));
      continue;
    }
    if (p == "transpose") {
      auto perm = graph.params(v.id).value("permutation", std::vector<int>{});
      if (perm.size() != t.dims.size())
        break;
      for (auto& d : t.dims)
        d = perm[static_cast<size_t>(d)];
      t.through_transpose = true;
      v = graph.operand(v.id, 0);
      continue;
    }
    if (p == "neg") {
      t.scale = -t.scale;
      v = graph.operand(v.id, 0);
      continue;
    }
    if ((p == "mul" || p == "div") && graph.operand_count(v.id) == 2) {
      auto a = graph.operand(v.id, 0), b = graph.operand(v.id, 1);
      auto sa = scalar_value(graph, a), sb = scalar_value(graph, b);
      auto same_shape = [&](const value_ref& x) { return graph.shape(x).size() == t.dims.size(); };
      if (sb && *sb != 0 && std::isfinite(*sb) && same_shape(a)) {
        t.scale *= p == "mul" ? *sb : 1.0 / *sb;
        v = a;
        continue;
      }
      if (p == "mul" && sa && std::isfinite(*sa) && same_shape(b)) {
        t.scale *= *sa;
        v = b;
        continue;
      }
    }
    break;
  }
  t.source = v;
  if (v.is_input())
    t.narrowest = narrower(t.narrowest, graph.dtype(v));
  return t;
}

}  // namespace maxkernel::agents::expert
