#include "agents/expert/replay_program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

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

std::string tuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (auto x : v)
    s += std::to_string(x) + ", ";
  return s + ")";
}

bool is_float(const std::string& dtype) {
  return dtype.find("float") != std::string::npos;
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
    {"shift_right_arithmetic", "lax.shift_right_arithmetic"}, {"copysign", "jnp.copysign"},
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
    {"square", "lax.square"}, {"not", "lax.bitwise_not"}, {"stop_gradient", "lax.stop_gradient"},
    {"population_count", "lax.population_count"}, {"clz", "lax.clz"}, {"lgamma", "lax.lgamma"},
    {"digamma", "lax.digamma"}, {"copy", ""}, {"copy_p", ""}, {"optimization_barrier", ""},
  };
  return m;
}

// Block mode: jnp forms that lower in Mosaic (erfc and expm1 have no TPU kernel lowering).
const std::map<std::string, std::string>& block_unary() {
  static const std::map<std::string, std::string> m = {
    {"neg", "(-{0})"}, {"sign", "jnp.sign({0})"}, {"floor", "jnp.floor({0})"},
    {"ceil", "jnp.ceil({0})"}, {"abs", "jnp.abs({0})"}, {"exp", "jnp.exp({0})"},
    {"exp2", "jnp.exp2({0})"}, {"log", "jnp.log({0})"}, {"log1p", "jnp.log1p({0})"},
    {"expm1", "(jnp.exp({0}) - 1.0)"}, {"tanh", "jnp.tanh({0})"},
    {"logistic", "lax.logistic({0})"}, {"sin", "jnp.sin({0})"}, {"cos", "jnp.cos({0})"},
    {"sqrt", "jnp.sqrt({0})"}, {"rsqrt", "lax.rsqrt({0})"}, {"erf", "lax.erf({0})"},
    {"erfc", "(1.0 - lax.erf({0}))"}, {"square", "({0} * {0})"}, {"not", "jnp.logical_not({0})"},
    {"stop_gradient", "{0}"}, {"copy", "{0}"}, {"copy_p", "{0}"}, {"is_finite", "jnp.isfinite({0})"},
    {"optimization_barrier", "{0}"},
  };
  return m;
}

const std::map<std::string, std::string>& block_binary() {
  static const std::map<std::string, std::string> m = {
    {"add", "({0} + {1})"}, {"add_any", "({0} + {1})"}, {"sub", "({0} - {1})"},
    {"mul", "({0} * {1})"}, {"max", "jnp.maximum({0}, {1})"}, {"min", "jnp.minimum({0}, {1})"},
    {"pow", "jnp.power({0}, {1})"}, {"eq", "({0} == {1})"}, {"ne", "({0} != {1})"},
    {"lt", "({0} < {1})"}, {"le", "({0} <= {1})"}, {"gt", "({0} > {1})"}, {"ge", "({0} >= {1})"},
    {"and", "({0} & {1})"}, {"or", "({0} | {1})"}, {"xor", "({0} ^ {1})"},
  };
  return m;
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

}  // namespace

std::string py_dtype(const std::string& dtype) {
  if (dtype == "bool")
    return "jnp.bool_";
  return "jnp." + dtype;
}

const std::string& replay_prelude() {
  static const std::string s = R"(def _reduce(prim, x, axes):
    # binds the reduction primitive itself (jnp.sum would upcast bf16 first)
    try:
        return prim.bind(x, axes=tuple(axes), out_sharding=None)
    except TypeError:
        return prim.bind(x, axes=tuple(axes))
)";
  return s;
}

std::string replay_code::code(int indent_spaces) const {
  std::string pad(indent_spaces, ' '), s;
  for (const auto& l : lines) {
    size_t pos = 0;
    while (pos <= l.size()) {
      size_t end = l.find('\n', pos);
      if (end == std::string::npos)
        end = l.size();
      s += pad + l.substr(pos, end - pos) + "\n";
      pos = end + 1;
    }
  }
  return s;
}

bool build_replay(const graph_view& graph, const dim_symbols& dims, const replay_request& req,
                  replay_code& out, std::string& reason) {
  out = replay_code{};
  // What the outputs need, stopping at given nodes and inputs.
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

  // jnp's wrap of negative indices, select_n(i < 0, i, i + n) feeding a gather's or a
  // scatter's indices: n is the size of the indexed dim, written as its expression.
  std::map<std::pair<int, unsigned>, std::string> literal_override;
  for (unsigned id = 0; id < graph.size(); ++id) {
    int n = static_cast<int>(id);
    auto p = graph.primitive(n);
    bool gather = p == "gather";
    if (!gather && p != "scatter" && p != "scatter-add" && p != "scatter_add")
      continue;
    const auto dn = graph.params(n).value("dimension_numbers", nlohmann::json::object());
    auto axes = ints(dn, gather ? "start_index_map" : "scatter_dims_to_operand_dims");
    if (axes.size() != 1 || graph.operand_count(n) < 2)
      continue;
    auto v = graph.operand(n, 1);
    while (v.is_node() && (graph.primitive(v.id) == "broadcast_in_dim" ||
                           graph.primitive(v.id) == "convert_element_type" ||
                           graph.primitive(v.id) == "reshape"))
      v = graph.operand(v.id, 0);
    if (!v.is_node() || graph.primitive(v.id) != "select_n" || graph.operand_count(v.id) != 3)
      continue;
    auto add = graph.operand(v.id, 2);
    if (!add.is_node() || graph.primitive(add.id) != "add")
      continue;
    auto src = graph.operand(n, 0);
    auto size = graph.shape(src);
    int r = src.is_node() ? dims.result_of_operand(n, 0) : 0;
    for (unsigned k = 0; k < 2; ++k) {
      auto lit = graph.operand(add.id, k);
      if (!lit.is_literal() || axes[0] >= static_cast<int64_t>(size.size()) ||
          lit.literal != std::to_string(size[static_cast<size_t>(axes[0])]))
        continue;
      auto e = dims.dim_expr(src, static_cast<int>(axes[0]), r);
      if (!e.empty())
        literal_override[{add.id, k}] = fmt::format(
            "np.asarray({}, dtype={})", e,
            py_dtype(graph.node(add.id).getOperands()[k].getDtype().cStr()));
    }
  }

  // jnp.mean / jnp.var: a reduce_sum divided by a literal equal to the element count of the
  // reduced dims (or multiplied by its reciprocal). The count is the product of those dims'
  // expressions, so the mean stays a mean at the tester's reduced sizes; a literal the sizes
  // do not explain stays a constant.
  if (!req.block_mode)
    for (unsigned id = 0; id < graph.size(); ++id) {
      int n = static_cast<int>(id);
      auto p = graph.primitive(n);
      if ((p != "div" && p != "mul") || graph.operand_count(n) != 2)
        continue;
      for (unsigned k = p == "div" ? 1u : 0u; k < 2; ++k) {
        auto lit = graph.operand(n, k);
        if (!lit.is_literal())
          continue;
        auto parsed = nlohmann::json::parse(lit.literal, nullptr, false);
        if (!parsed.is_number())
          continue;
        double value = parsed.get<double>();
        auto v = graph.operand(n, 1 - k);
        while (v.is_node() && (graph.primitive(v.id) == "broadcast_in_dim" ||
                               graph.primitive(v.id) == "reshape" ||
                               graph.primitive(v.id) == "squeeze" ||
                               graph.primitive(v.id) == "expand_dims" ||
                               graph.primitive(v.id) == "convert_element_type"))
          v = graph.operand(v.id, 0);
        if (!v.is_node() || graph.primitive(v.id) != "reduce_sum" ||
            graph.operand_count(v.id) != 1)
          continue;
        auto axes = ints(graph.params(v.id), "axes");
        auto src = graph.operand(v.id, 0);
        auto src_shape = to_vector(graph.node(v.id).getOperands()[0].getShape());
        int r = !src.is_node() ? 0 : src.result >= 0 ? src.result : dims.result_of_operand(v.id, 0);
        double count = 1;
        std::string expr;
        for (auto a : axes) {
          auto e = a >= 0 && a < static_cast<int64_t>(src_shape.size()) && r >= 0
                       ? dims.dim_expr(src, static_cast<int>(a), r) : std::string();
          if (e.empty()) {
            expr.clear();
            break;
          }
          count *= static_cast<double>(src_shape[static_cast<size_t>(a)]);
          expr += (expr.empty() ? "" : " * ") + e;
        }
        if (expr.empty() || axes.empty())
          continue;
        std::string dtype = graph.node(n).getOperands()[k].getDtype().cStr();
        if (p == "div" && std::abs(value - count) <= 1e-6 * count)
          literal_override[{n, k}] =
              fmt::format("np.asarray({}, dtype={})", expr, py_dtype(dtype));
        else if (p == "mul" && std::abs(value * count - 1.0) <= 1e-6)
          literal_override[{n, k}] =
              fmt::format("np.asarray(1.0 / ({}), dtype={})", expr, py_dtype(dtype));
      }
    }

  auto var_name = [&](int n, int r) {
    auto results = graph.node(n).getResults();
    return results.size() > 1 ? fmt::format("{}{}_{}", req.prefix, n, r)
                              : fmt::format("{}{}", req.prefix, n);
  };
  // Expression of operand k of node n.
  auto operand = [&](int n, unsigned k, std::string& e) -> bool {
    auto v = graph.operand(n, k);
    auto type = graph.node(n).getOperands()[k];
    std::string dtype = type.getDtype().cStr();
    if (v.is_node()) {
      if (req.given.count(v.id)) {
        e = req.given.at(v.id);
        return true;
      }
      auto results = graph.node(v.id).getResults();
      // The summary says which result (analyze's operandResults); older ones do not: then
      // the result is the one of the operand's type, refused when several have it.
      if (v.result >= 0 && static_cast<unsigned>(v.result) < results.size()) {
        e = var_name(v.id, v.result);
        return true;
      }
      int r = dims.result_of_operand(n, k);
      int matches = 0;
      for (auto res : results)
        matches += to_vector(res.getShape()) == to_vector(type.getShape()) &&
                   std::string(res.getDtype().cStr()) == dtype;
      // jnp.argsort: sort(keys, iota) with one key, read for the permutation; the summary
      // does not say which result a consumer reads, and argsort drops the sorted keys.
      auto iota_operand = graph.operand(v.id, 1);
      if (matches > 1 && graph.primitive(v.id) == "sort" && results.size() == 2 &&
          graph.params(v.id).value("num_keys", 1) == 1 && iota_operand.is_node() &&
          graph.primitive(iota_operand.id) == "iota") {
        e = var_name(v.id, 1);
        return true;
      }
      if (r < 0 || (results.size() > 1 && matches > 1)) {
        reason = fmt::format("node {} ({}) reads a result of node {} ({}) that its type does not "
                             "identify", n, graph.primitive(n), v.id, graph.primitive(v.id));
        return false;
      }
      e = var_name(v.id, r);
      return true;
    }
    if (v.is_input()) {
      if (req.block_mode || static_cast<size_t>(v.id) >= req.inputs.size()) {
        reason = fmt::format("node {} ({}) reads graph input {} inside a kernel block", n,
                             graph.primitive(n), v.id);
        return false;
      }
      e = req.inputs[v.id];
      return true;
    }
    if (v.is_literal() && literal_override.count({n, k})) {
      e = literal_override.at({n, k});
      return true;
    }
    if (v.is_literal()) {
      auto shape = to_vector(type.getShape());
      if (!shape.empty()) {
        if (req.block_mode) {
          reason = fmt::format("node {} ({}) has an array constant", n, graph.primitive(n));
          return false;
        }
        e = fmt::format("np.asarray({}, dtype={})", literal_value(v.literal), py_dtype(dtype));
        return true;
      }
      if (req.block_mode)
        e = is_float(dtype) ? fmt::format("jnp.float32({})", literal_value(v.literal))
            : dtype == "bool" ? fmt::format("{}", literal_value(v.literal))
                              : fmt::format("jnp.int32({})", literal_value(v.literal));
      else
        e = fmt::format("np.asarray({}, dtype={})", literal_value(v.literal), py_dtype(dtype));
      return true;
    }
    reason = fmt::format("node {} ({}): operand {} is neither a value, an input nor a literal", n,
                         graph.primitive(n), k);
    return false;
  };

  for (unsigned id = 0; id < graph.size(); ++id) {
    int n = static_cast<int>(id);
    if (req.statements.count(n)) {
      out.lines.push_back(req.statements.at(n));
      continue;
    }
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
    value_ref self{value_ref::kind::node, n, ""};
    std::string res = var_name(n, 0);
    std::string out_dtype = node.getResults().size() ? node.getResults()[0].getDtype().cStr() : "";
    auto shape = [&](int r = 0) { return dims.shape_expr(self, r); };
    auto need_shape = [&](std::string& s) {
      s = shape();
      if (s.empty())
        reason = fmt::format("node {} ({}): a size of its result is not tied to the inputs", n, p);
      return !s.empty();
    };
    std::string e;

    if (req.block_mode) {
      // A narrow float result is rounded after every op, and logistic is expanded the way
      // XLA's CPU backend evaluates it in that type (exp, 1 + _, 1 / _, each rounded): the
      // reference's values, not merely f32 ones (XLA's bf16 sigmoid differs from a correctly
      // rounded one on a third of its inputs).
      bool narrow = is_float(out_dtype) && out_dtype != "float32" && out_dtype != "float64";
      auto round = [&](const std::string& x) {
        return narrow ? fmt::format("({}).astype({}).astype(jnp.float32)", x, py_dtype(out_dtype))
                      : x;
      };
      if (narrow && p == "logistic" && a.size() == 1) {
        e = round("1.0 / " + round("1.0 + " + round(fmt::format("jnp.exp(-{})", a[0]))));
      } else if (narrow && p == "integer_pow" && a.size() == 1) {
        // jax lowers x ** y by binary exponentiation over rounded products
        int y = params.value("y", 1);
        bool reciprocal = y < 0;
        y = std::abs(y);
        std::string acc, base = a[0];
        for (; y > 0; y >>= 1) {
          if (y & 1)
            acc = acc.empty() ? base : round(fmt::format("{} * {}", acc, base));
          if (y > 1)
            base = round(fmt::format("{} * {}", base, base));
        }
        if (acc.empty())
          acc = "jnp.ones_like(" + a[0] + ")";
        e = reciprocal ? round("1.0 / " + acc) : acc;
      } else if (block_unary().count(p) && a.size() == 1) {
        e = fmt::format(fmt::runtime(block_unary().at(p)), a[0]);
      } else if (block_binary().count(p) && a.size() == 2) {
        e = fmt::format(fmt::runtime(block_binary().at(p)), a[0], a[1]);
      } else if (p == "div" && a.size() == 2) {
        e = is_float(out_dtype) ? fmt::format("({} / {})", a[0], a[1])
                                : fmt::format("lax.div({}, {})", a[0], a[1]);
      } else if (p == "integer_pow" && a.size() == 1) {
        e = fmt::format("lax.integer_pow({}, {})", a[0], params.value("y", 1));
      } else if (p == "select_n" && a.size() == 3) {
        e = fmt::format("jnp.where({}, {}, {})", a[0], a[2], a[1]);
      } else if (p == "clamp" && a.size() == 3) {
        e = fmt::format("jnp.clip({1}, {0}, {2})", a[0], a[1], a[2]);
      } else if (p == "convert_element_type" && a.size() == 1) {
        std::string to = params.value("new_dtype", "float32");
        std::string from = node.getOperands()[0].getDtype().cStr();
        if (is_float(to) && is_float(from))
          e = to == "float32" || to == "float64"
                  ? a[0] : fmt::format("{}.astype({}).astype(jnp.float32)", a[0], py_dtype(to));
        else if (is_float(to))
          e = fmt::format("{}.astype(jnp.float32)", a[0]);
        else if (to == "bool")
          e = fmt::format("({} != 0)", a[0]);
        else
          e = fmt::format("{}.astype(jnp.int32)", a[0]);
      } else if (p == "reduce_precision" && a.size() == 1) {
        e = fmt::format("lax.reduce_precision({}, {}, {})", a[0], params.value("exponent_bits", 8),
                        params.value("mantissa_bits", 23));
      } else if (p == "broadcast_in_dim" && a.size() == 1 &&
                 node.getOperands()[0].getShape().size() == 0) {
        e = a[0];  // a scalar: jnp broadcasting does the rest
      } else {
        reason = fmt::format("node {} ({}) is not elementwise: it cannot run on kernel blocks", n, p);
        return false;
      }
      if (narrow && p != "logistic" && p != "integer_pow" && p != "convert_element_type")
        e = round(e);
      out.lines.push_back(fmt::format("{} = {}", res, e));
      out.nodes.push_back(n);
      out.primitives.insert(p);
      out.flops += node.getFlops();
      continue;
    }

    std::string s;
    if (binary_ops().count(p) && a.size() == 2) {
      e = fmt::format("{}(*jnp.broadcast_arrays({}, {}))", binary_ops().at(p), a[0], a[1]);
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
    } else if (p == "select_n") {
      std::string cases;
      for (size_t k = 1; k < a.size(); ++k)
        cases += ", " + a[k];
      e = fmt::format("lax.select_n(*jnp.broadcast_arrays({}{}))", a[0], cases);
      if (node.getOperands()[0].getShape().size() == 0)
        e = fmt::format("lax.select_n({}{})", a[0], cases);
    } else if (p == "clamp") {
      e = fmt::format("lax.clamp({}, {}, {})", a[0], a[1], a[2]);
    } else if (p == "broadcast_in_dim") {
      if (!need_shape(s))
        return false;
      e = fmt::format("lax.broadcast_in_dim({}, {}, {})", a[0], s,
                      tuple(ints(params, "broadcast_dimensions")));
    } else if (p == "reshape") {
      if (!need_shape(s))
        return false;
      e = fmt::format("lax.reshape({}, {})", a[0], s);
    } else if (p == "squeeze") {
      e = fmt::format("lax.squeeze({}, {})", a[0], tuple(ints(params, "dimensions")));
    } else if (p == "transpose") {
      e = fmt::format("lax.transpose({}, {})", a[0], tuple(ints(params, "permutation")));
    } else if (p == "rev") {
      e = fmt::format("lax.rev({}, {})", a[0], tuple(ints(params, "dimensions")));
    } else if (p == "reduce_sum" || p == "reduce_max" || p == "reduce_min" || p == "reduce_prod" ||
               p == "reduce_and" || p == "reduce_or" || p == "reduce_xor") {
      e = fmt::format("_reduce(lax.{}_p, {}, {})", p, a[0], tuple(ints(params, "axes")));
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
      if (!need_shape(s))
        return false;
      e = fmt::format("lax.broadcasted_iota({}, {}, {})", py_dtype(params.value("dtype", "int32")),
                      s, params.value("dimension", 0));
    } else if (p == "dot_general") {
      auto pref = params.contains("preferred_element_type") && params["preferred_element_type"].is_string()
                      ? py_dtype(params["preferred_element_type"].get<std::string>()) : "None";
      e = fmt::format("lax.dot_general({}, {}, (({}, {}), ({}, {})), preferred_element_type={})",
                      a[0], a[1], tuple(ints(params, "lhs_contracting")),
                      tuple(ints(params, "rhs_contracting")), tuple(ints(params, "lhs_batch")),
                      tuple(ints(params, "rhs_batch")), pref);
    } else if (p == "top_k") {
      auto rank = static_cast<int>(node.getOperands()[0].getShape().size());
      int axis = params.contains("axis") && params["axis"].is_number_integer()
                     ? params["axis"].get<int>() : rank - 1;
      res = fmt::format("{}, {}", var_name(n, 0), var_name(n, 1));
      e = fmt::format("lax.top_k({}, {}{})", a[0], params.value("k", 1),
                      axis == rank - 1 || axis == -1 ? "" : fmt::format(", axis={}", axis));
    } else if (p == "sort") {
      std::string list;
      for (const auto& x : a)
        list += x + ", ";
      res.clear();
      for (unsigned r = 0; r < node.getResults().size(); ++r)
        res += (r ? ", " : "") + var_name(n, static_cast<int>(r));
      if (node.getResults().size() == 1)
        res += ",";
      e = fmt::format("lax.sort(({}), dimension={}, is_stable={}, num_keys={})", list,
                      params.value("dimension", 0), params.value("is_stable", false) ? "True" : "False",
                      params.value("num_keys", 1));
    } else if (p == "concatenate") {
      std::string list;
      for (const auto& x : a)
        list += x + ", ";
      e = fmt::format("lax.concatenate([{}], {})", list, params.value("dimension", 0));
    } else if (p == "slice") {
      auto lo = ints(params, "start_indices"), hi = ints(params, "limit_indices");
      auto strides = ints(params, "strides");
      auto src = graph.operand(n, 0);
      int r = src.is_node() ? dims.result_of_operand(n, 0) : 0;
      std::string los = "(", his = "(";
      for (size_t i = 0; i < lo.size() && i < hi.size(); ++i) {
        auto l = dims.bound_expr(src, static_cast<int>(i), lo[i], r);
        auto h = dims.bound_expr(src, static_cast<int>(i), hi[i], r);
        if (l.empty() || h.empty()) {
          reason = fmt::format("node {} (slice): a bound is not tied to the inputs", n);
          return false;
        }
        los += l + ", ";
        his += h + ", ";
      }
      e = fmt::format("lax.slice({}, {}), {}){})", a[0], los, his,
                      strides.empty() ? "" : ", " + tuple(strides));
    } else if (p == "dynamic_slice") {
      auto sizes = ints(params, "slice_sizes");
      auto src = graph.operand(n, 0);
      int r = src.is_node() ? dims.result_of_operand(n, 0) : 0;
      std::string ss = "(", idx;
      for (size_t i = 0; i < sizes.size(); ++i) {
        auto b = dims.bound_expr(src, static_cast<int>(i), sizes[i], r);
        if (b.empty()) {
          reason = fmt::format("node {} (dynamic_slice): a size is not tied to the inputs", n);
          return false;
        }
        ss += b + ", ";
      }
      for (size_t k = 1; k < a.size(); ++k)
        idx += a[k] + ", ";
      e = fmt::format("lax.dynamic_slice({}, ({}), {}))", a[0], idx, ss);
    } else if (p == "dynamic_update_slice") {
      std::string idx;
      for (size_t k = 2; k < a.size(); ++k)
        idx += a[k] + ", ";
      e = fmt::format("lax.dynamic_update_slice({}, {}, ({}))", a[0], a[1], idx);
    } else if (p == "gather" && a.size() == 2) {
      const auto dn = params.value("dimension_numbers", nlohmann::json::object());
      auto sizes = ints(params, "slice_sizes");
      auto src = graph.operand(n, 0);
      int r = src.is_node() ? dims.result_of_operand(n, 0) : 0;
      std::string ss = "(";
      for (size_t i = 0; i < sizes.size(); ++i) {
        auto b = dims.bound_expr(src, static_cast<int>(i), sizes[i], r);
        if (b.empty()) {
          reason = fmt::format("node {} (gather): a slice size is not tied to the inputs", n);
          return false;
        }
        ss += b + ", ";
      }
      std::string fill = params.contains("fill_value") && !params["fill_value"].is_null()
                             ? literal_value(params["fill_value"].dump()) : "None";
      e = fmt::format(
          "lax.gather({}, {}, lax.GatherDimensionNumbers(offset_dims={}, collapsed_slice_dims={}, "
          "start_index_map={}, operand_batching_dims={}, start_indices_batching_dims={}), {}), "
          "indices_are_sorted={}, unique_indices={}, mode=lax.GatherScatterMode.{}, fill_value={})",
          a[0], a[1], tuple(ints(dn, "offset_dims")), tuple(ints(dn, "collapsed_slice_dims")),
          tuple(ints(dn, "start_index_map")), tuple(ints(dn, "operand_batching_dims")),
          tuple(ints(dn, "start_indices_batching_dims")), ss,
          params.value("indices_are_sorted", false) ? "True" : "False",
          params.value("unique_indices", false) ? "True" : "False",
          params.value("mode", "FILL_OR_DROP"), fill);
    } else if ((p == "scatter" || p == "scatter-add" || p == "scatter_add") && a.size() == 3) {
      const auto dn = params.value("dimension_numbers", nlohmann::json::object());
      e = fmt::format(
          "lax.{}({}, {}, {}, lax.ScatterDimensionNumbers(update_window_dims={}, "
          "inserted_window_dims={}, scatter_dims_to_operand_dims={}, operand_batching_dims={}, "
          "scatter_indices_batching_dims={}), indices_are_sorted={}, unique_indices={}, "
          "mode=lax.GatherScatterMode.{})",
          p == "scatter" ? "scatter" : "scatter_add", a[0], a[1], a[2],
          tuple(ints(dn, "update_window_dims")), tuple(ints(dn, "inserted_window_dims")),
          tuple(ints(dn, "scatter_dims_to_operand_dims")), tuple(ints(dn, "operand_batching_dims")),
          tuple(ints(dn, "scatter_indices_batching_dims")),
          params.value("indices_are_sorted", false) ? "True" : "False",
          params.value("unique_indices", false) ? "True" : "False",
          params.value("mode", "FILL_OR_DROP"));
    } else if (p == "split") {
      int axis = params.value("axis", 0);
      auto src = graph.operand(n, 0);
      int r = src.is_node() ? dims.result_of_operand(n, 0) : 0;
      std::string sizes;
      res.clear();
      for (unsigned k = 0; k < node.getResults().size(); ++k) {
        auto size = node.getResults()[k].getShape()[axis];
        auto b = dims.bound_expr(src, axis, size, r);
        if (b.empty()) {
          reason = fmt::format("node {} (split): a size is not tied to the inputs", n);
          return false;
        }
        sizes += b + ", ";
        res += (k ? ", " : "") + var_name(n, static_cast<int>(k));
      }
      e = fmt::format("lax.split({}, ({}), axis={})", a[0], sizes, axis);
    } else {
      reason = fmt::format("node {} ({}) has no replay rule", n, p);
      return false;
    }
    out.lines.push_back(fmt::format("{} = {}", res, e));
    out.nodes.push_back(n);
    out.primitives.insert(p);
    out.flops += node.getFlops();
  }

  for (const auto& v : req.outputs) {
    if (v.is_node()) {
      if (req.given.count(v.id)) {
        out.outputs.push_back(req.given.at(v.id));
      } else {
        if (graph.node(v.id).getResults().size() != 1) {
          reason = fmt::format("output node {} has several results", v.id);
          return false;
        }
        out.outputs.push_back(var_name(v.id, 0));
      }
    } else if (v.is_input() && !req.block_mode && static_cast<size_t>(v.id) < req.inputs.size()) {
      out.outputs.push_back(req.inputs[v.id]);
    } else {
      reason = "an output is neither a node nor an input";
      return false;
    }
  }
  return true;
}

}  // namespace maxkernel::agents::expert::moe
