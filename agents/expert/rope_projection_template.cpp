// Template "rope_projection": projections x @ W followed by rotary position embedding in the
// rotate-half layout (q = RoPE(x W_q), k = RoPE(x W_k)), the rotation fused as the GEMM's
// epilogue (agents/expert/templates/rope_projection.py).
// Recognised per graph output, by the dataflow: out = cast(y * C + R * S) (either order of
// the sum and of each product) where y is a dot_general of two graph inputs (x contracting
// its last dim, W its first; no batch dims; y's last dim the head dim D), R swaps y's halves
// along D with a sign per half (concatenate of the split or sliced halves, second first,
// each optionally negated), and C, S are values that do not depend on y and do not vary
// along W's head dims (the cos / sin tables, whatever computes them). C and S are replayed
// from the graph outside the kernel as shape-lazy jnp (table_emitter). Refused otherwise.
#include "agents/expert/block_size.hpp"
#include "agents/expert/graph_view.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_args.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

namespace maxkernel::agents::expert {

namespace {

using json = nlohmann::json;

value_ref node_value(int id, int result = 0) {
  value_ref v;
  v.what = value_ref::kind::node;
  v.id = id;
  v.result = result;
  return v;
}

bool same_value(const value_ref& a, const value_ref& b) {
  return a.what == b.what && a.id == b.id && (a.what != value_ref::kind::node || a.result <= 0 || b.result <= 0 || a.result == b.result);
}

value_ref skip_converts(const graph_view& g, value_ref v) {
  while (v.is_node() && g.primitive(v.id) == "convert_element_type")
    v = g.operand(v.id, 0);
  return v;
}

bool depends_on(const graph_view& g, const value_ref& v, int target) {
  if (!v.is_node())
    return false;
  std::vector<int> stack{v.id};
  std::set<int> seen;
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (id == target)
      return true;
    if (!seen.insert(id).second || id < target)
      continue;
    for (unsigned k = 0; k < g.operand_count(id); ++k)
      if (auto o = g.operand(id, k); o.is_node())
        stack.push_back(o.id);
  }
  return false;
}

std::vector<int> ints_of(const json& j) {
  std::vector<int> out;
  if (j.is_array())
    for (const auto& x : j)
      if (x.is_number_integer())
        out.push_back(x.get<int>());
  return out;
}

// One projection with its rotation.
struct rope_output {
  int out_node = -1;          // the graph output's node
  int dot = -1;
  int x = -1, w = -1;         // graph inputs
  value_ref y;                // the projection as the rotation reads it
  value_ref cos_t, sin_t;     // the tables (before broadcasting to the heads)
  std::vector<int> cos_dims, sin_dims;  // broadcast_dimensions into the output's rank (empty: same rank)
  double sign_first = -1, sign_second = 1;
  std::string dot_dtype, acc_round, out_dtype;
};

// The half of y along its last axis that `v` is: 0 first, 1 second, -1 neither.
int half_of(const graph_view& g, value_ref v, const value_ref& y, int64_t d) {
  if (!v.is_node())
    return -1;
  auto p = g.primitive(v.id);
  int last = static_cast<int>(g.shape(y).size()) - 1;
  if (p == "split") {
    const auto& params = g.params(v.id);
    auto sizes = ints_of(params.value("sizes", json()));
    if (params.value("axis", -1) != last || sizes.size() != 2 || sizes[0] * 2 != d ||
        !same_value(g.operand(v.id, 0), y))
      return -1;
    return v.result;
  }
  if (p == "slice") {
    const auto& params = g.params(v.id);
    auto start = ints_of(params.value("start_indices", json()));
    auto limit = ints_of(params.value("limit_indices", json()));
    auto shape = g.shape(y);
    if (!same_value(g.operand(v.id, 0), y) || start.size() != shape.size())
      return -1;
    for (int a = 0; a < last; ++a)
      if (start[a] != 0 || limit[a] != shape[a])
        return -1;
    auto strides = ints_of(params.value("strides", json()));
    for (int s : strides)
      if (s != 1)
        return -1;
    if (start[last] == 0 && limit[last] * 2 == d)
      return 0;
    if (start[last] * 2 == d && limit[last] == d)
      return 1;
  }
  return -1;
}

// A half, possibly negated: (half, sign).
std::pair<int, double> signed_half(const graph_view& g, value_ref v, const value_ref& y, int64_t d) {
  double sign = 1;
  while (v.is_node()) {
    auto p = g.primitive(v.id);
    if (p == "neg") {
      sign = -sign;
      v = g.operand(v.id, 0);
    } else if (p == "mul" && g.operand_count(v.id) == 2) {
      auto a = g.operand(v.id, 0), b = g.operand(v.id, 1);
      auto lit = b.is_literal() ? b.literal : a.is_literal() ? a.literal : std::string();
      auto j = json::parse(lit, nullptr, false);
      if (!j.is_number() || std::abs(std::abs(j.get<double>()) - 1.0) > 0)
        break;
      sign *= j.get<double>();
      v = b.is_literal() ? a : b;
    } else {
      break;
    }
  }
  return {half_of(g, v, y, d), sign};
}

// R = concatenate([±second half, ±first half]) of y along the last axis.
bool read_swap(const graph_view& g, value_ref r, const value_ref& y, int64_t d, rope_output& o) {
  if (!r.is_node() || g.primitive(r.id) != "concatenate" || g.operand_count(r.id) != 2)
    return false;
  int last = static_cast<int>(g.shape(y).size()) - 1;
  if (g.params(r.id).value("dimension", -1) != last)
    return false;
  auto [h0, s0] = signed_half(g, g.operand(r.id, 0), y, d);
  auto [h1, s1] = signed_half(g, g.operand(r.id, 1), y, d);
  if (h0 != 1 || h1 != 0)
    return false;
  o.sign_first = s0;
  o.sign_second = s1;
  return true;
}

// A table: independent of the projection, constant along the head dims. Strips a
// broadcast_in_dim into the output's shape (recording its dims).
bool read_table(const graph_view& g, value_ref t, const rope_output& o, size_t heads_lo,
                size_t heads_hi, value_ref& table, std::vector<int>& dims) {
  if (depends_on(g, t, o.dot))
    return false;
  dims.clear();
  auto out_shape = g.shape(node_value(o.out_node));
  if (t.is_node() && g.primitive(t.id) == "broadcast_in_dim") {
    auto bd = ints_of(g.params(t.id).value("broadcast_dimensions", json()));
    auto inner = g.operand(t.id, 0);
    auto ishape = g.shape(inner);
    if (bd.size() != ishape.size())
      return false;
    std::vector<int64_t> expanded(out_shape.size(), 1);
    for (size_t i = 0; i < bd.size(); ++i)
      expanded[static_cast<size_t>(bd[i])] = ishape[i];
    for (size_t a = heads_lo; a < heads_hi; ++a)
      if (expanded[a] != 1)
        return false;
    dims = bd;
    table = inner;
    return true;
  }
  auto shape = g.shape(t);
  if (shape.size() != out_shape.size())
    return false;
  for (size_t a = heads_lo; a < heads_hi; ++a)
    if (shape[a] != 1)
      return false;
  table = t;
  return true;
}

bool match_output(const graph_view& g, value_ref out, rope_output& o, std::string& why) {
  if (!out.is_node()) {
    why = "an output that is not computed";
    return false;
  }
  o.out_node = out.id;
  o.out_dtype = g.dtype(out);
  auto v = skip_converts(g, out);
  if (!v.is_node() || (g.primitive(v.id) != "add" && g.primitive(v.id) != "add_any")) {
    why = "an output that is not a sum of two products";
    return false;
  }
  auto out_shape = g.shape(out);
  for (int order = 0; order < 2; ++order) {
    auto a = g.operand(v.id, static_cast<unsigned>(order));
    auto b = g.operand(v.id, static_cast<unsigned>(1 - order));
    if (!a.is_node() || !b.is_node() || g.primitive(a.id) != "mul" || g.primitive(b.id) != "mul")
      continue;
    for (int ya = 0; ya < 2; ++ya) {
      auto y = g.operand(a.id, static_cast<unsigned>(ya));
      auto c = g.operand(a.id, static_cast<unsigned>(1 - ya));
      auto dot = skip_converts(g, y);
      if (!dot.is_node() || g.primitive(dot.id) != "dot_general" || g.shape(y) != out_shape)
        continue;
      const auto& p = g.params(dot.id);
      auto x = skip_converts(g, g.operand(dot.id, 0));
      auto w = skip_converts(g, g.operand(dot.id, 1));
      if (!x.is_input() || !w.is_input())
        continue;
      auto xs = g.shape(x), ws = g.shape(w);
      if (xs.size() < 2 || ws.size() < 2 ||
          ints_of(p.value("lhs_contracting", json())) != std::vector<int>{static_cast<int>(xs.size()) - 1} ||
          ints_of(p.value("rhs_contracting", json())) != std::vector<int>{0} ||
          !ints_of(p.value("lhs_batch", json())).empty() || !ints_of(p.value("rhs_batch", json())).empty())
        continue;
      int64_t d = ws.back();
      if (d % 2 != 0)
        continue;
      o.dot = dot.id;
      o.x = x.id;
      o.w = w.id;
      o.y = y;
      for (int rb = 0; rb < 2; ++rb) {
        auto r = g.operand(b.id, static_cast<unsigned>(rb));
        auto s = g.operand(b.id, static_cast<unsigned>(1 - rb));
        if (!read_swap(g, r, y, d, o))
          continue;
        size_t heads_lo = xs.size() - 1, heads_hi = out_shape.size() - 1;
        if (!read_table(g, c, o, heads_lo, heads_hi, o.cos_t, o.cos_dims) ||
            !read_table(g, s, o, heads_lo, heads_hi, o.sin_t, o.sin_dims))
          continue;
        o.dot_dtype = g.dtype(g.operand(dot.id, 0));
        auto dot_out = g.dtype(dot);
        o.acc_round = dot_out == "float32" ? "" : dot_out;
        return true;
      }
    }
  }
  why = "not y * cos + swap_halves(y) * sin of a projection";
  return false;
}


// The cos / sin tables as jnp code over the inputs, shape-lazy: broadcasts only insert unit
// dims (jnp broadcasting fills them, and _rope_mm broadcasts the tables to [rows, 1.., D]),
// so the only sizes written are those of iotas, which must be the head dim D or D / 2
// (written from W's last dim, so they follow the tester's reduced shapes). A size read from
// nothing else is never guessed from an input of the same size.
struct table_emitter {
  const graph_view& g;
  const std::vector<std::string>& inputs;   // graph input k -> Python name
  std::string d_expr;                       // the head dim at trace time
  int64_t d = 0;
  std::map<int, std::string> done;
  std::string code;
  std::string why;

  static std::string py_dtype(const std::string& dt) {
    return dt == "bool" ? "jnp.bool_" : "jnp." + dt;
  }

  std::string literal(const value_ref& v, const std::string& dtype) {
    auto j = json::parse(v.literal, nullptr, false);
    std::string val;
    if (j.is_string())
      val = "float(\"" + j.get<std::string>() + "\")";
    else if (j.is_boolean())
      val = j.get<bool>() ? "True" : "False";
    else if (j.is_number_float() && d > 2 && j.get<double>() == static_cast<double>(d))
      val = "float(" + d_expr + ")";  // arange(0, D, 2) / D: the head dim, not a constant
    else if (j.is_number())
      val = v.literal;
    else
      return "";
    return dtype.empty() ? val : fmt::format("np.asarray({}, {})", val, py_dtype(dtype));
  }

  std::string size_expr(int64_t size) {
    if (size == 1)
      return "1";
    if (size == d)
      return d_expr;
    if (size * 2 == d)
      return "(" + d_expr + " // 2)";
    return "";
  }

  // Expression of value v; empty with `why` when it cannot be emitted.
  std::string emit(const value_ref& v, const std::string& want_dtype = "") {
    if (v.is_input())
      return inputs[static_cast<size_t>(v.id)];
    if (v.is_literal()) {
      auto e = literal(v, want_dtype);
      if (e.empty())
        why = "a literal of unknown form in the tables";
      return e;
    }
    if (!v.is_node()) {
      why = "an unknown value in the tables";
      return "";
    }
    if (auto it = done.find(v.id); it != done.end())
      return it->second;
    int id = v.id;
    auto p = g.primitive(id);
    auto dtype = g.dtype(node_value(id));
    const auto& params = g.params(id);
    unsigned n = g.operand_count(id);
    std::vector<std::string> ops;
    for (unsigned k = 0; k < n; ++k) {
      auto e = emit(g.operand(id, k), p == "convert_element_type" ? "" : g.dtype(node_value(id)));
      if (e.empty())
        return "";
      ops.push_back(e);
    }
    static const std::map<std::string, std::string> unary = {
        {"neg", "jnp.negative"}, {"cos", "jnp.cos"}, {"sin", "jnp.sin"}, {"exp", "jnp.exp"},
        {"log", "jnp.log"}, {"sqrt", "jnp.sqrt"}, {"rsqrt", "lax.rsqrt"}, {"tanh", "jnp.tanh"},
        {"abs", "jnp.abs"}, {"floor", "jnp.floor"}, {"ceil", "jnp.ceil"}, {"sign", "jnp.sign"},
        {"logistic", "jax.nn.sigmoid"}, {"stop_gradient", "lax.stop_gradient"},
        {"round", "jnp.round"}, {"log1p", "jnp.log1p"}, {"expm1", "jnp.expm1"},
        {"not", "jnp.logical_not"}};
    static const std::map<std::string, std::string> binary = {
        {"add", "jnp.add"}, {"add_any", "jnp.add"}, {"sub", "jnp.subtract"},
        {"mul", "jnp.multiply"}, {"div", "_table_div"}, {"pow", "jnp.power"},
        {"max", "jnp.maximum"}, {"min", "jnp.minimum"}, {"lt", "jnp.less"},
        {"le", "jnp.less_equal"}, {"gt", "jnp.greater"}, {"ge", "jnp.greater_equal"},
        {"eq", "jnp.equal"}, {"ne", "jnp.not_equal"}, {"and", "jnp.logical_and"},
        {"or", "jnp.logical_or"}, {"rem", "jnp.fmod"}, {"atan2", "jnp.arctan2"}};
    std::string e;
    if (unary.count(p) && n == 1) {
      e = fmt::format("{}({})", unary.at(p), ops[0]);
    } else if (binary.count(p) && n == 2) {
      e = fmt::format("{}({}, {})", binary.at(p), ops[0], ops[1]);
    } else if (p == "convert_element_type" && n == 1) {
      e = fmt::format("jnp.asarray({}).astype({})", ops[0], py_dtype(dtype));
    } else if (p == "integer_pow" && n == 1) {
      e = fmt::format("lax.integer_pow({}, {})", ops[0], params.value("y", 1));
    } else if (p == "select_n" && n == 3) {
      e = fmt::format("jnp.where({}, {}, {})", ops[0], ops[2], ops[1]);
    } else if (p == "iota" && n == 0) {
      auto shape = ints_of(params.value("shape", json()));
      std::string sh = "(";
      for (int s : shape) {
        auto x = size_expr(s);
        if (x.empty()) {
          why = fmt::format("an iota of size {} in the tables (not the head dim or its half)", s);
          return "";
        }
        sh += x + ", ";
      }
      e = fmt::format("lax.broadcasted_iota({}, {}), {})", py_dtype(params.value("dtype", dtype)),
                      sh, params.value("dimension", 0));
    } else if ((p == "broadcast_in_dim" || p == "expand_dims") && n == 1) {
      auto out_rank = g.shape(node_value(id)).size();
      auto bd = ints_of(params.value("broadcast_dimensions", json()));
      if (p == "expand_dims")
        bd.clear();
      std::string axes = "(";
      for (size_t a = 0; a < out_rank; ++a)
        if (p == "broadcast_in_dim" ? std::find(bd.begin(), bd.end(), static_cast<int>(a)) == bd.end()
                                     : false)
          axes += std::to_string(a) + ", ";
      if (p == "expand_dims")
        for (int a : ints_of(params.value("dimensions", json())))
          axes += std::to_string(a) + ", ";
      e = fmt::format("_table_expand({}, {}), {})", ops[0], axes, out_rank);
    } else if (p == "squeeze" && n == 1) {
      std::string axes = "(";
      for (int a : ints_of(params.value("dimensions", json())))
        axes += std::to_string(a) + ", ";
      e = fmt::format("jnp.squeeze({}, {}))", ops[0], axes);
    } else if (p == "concatenate" && n >= 1) {
      std::string list = "[";
      for (const auto& o : ops)
        list += o + ", ";
      e = fmt::format("_table_concat({}], {})", list, params.value("dimension", 0));
    } else {
      why = "primitive " + p + " in the tables";
      return "";
    }
    auto name = fmt::format("r{}", id);
    code += fmt::format("    {} = {}\n", name, e);
    done[id] = name;
    return name;
  }
};

class rope_projection_template final : public kernel_template {
public:
  std::string name() const override { return "rope_projection"; }

  std::string covers() const override {
    return "projections x @ W followed by rotary position embedding (rotate-half), the rotation "
           "fused as the GEMM's epilogue with cos / sin tables replayed from the reference";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    if (g.output_count() == 0)
      return std::nullopt;
    std::vector<rope_output> outs;
    std::string why;
    for (unsigned k = 0; k < g.output_count(); ++k) {
      rope_output o;
      if (!match_output(g, g.output(k), o, why))
        return std::nullopt;
      outs.push_back(o);
    }
    auto args = moe::make_workload_args(spec);
    if (args.graph_inputs.size() != g.input_count())
      return std::nullopt;
    const auto& w0 = outs[0];
    table_emitter tables{g, args.graph_inputs,
                         fmt::format("{}.shape[-1]", args.graph_inputs[static_cast<size_t>(w0.w)]),
                         g.shape(value_ref{value_ref::kind::input, w0.w, "", -1}).back()};
    for (const auto& o : outs)
      if (g.shape(value_ref{value_ref::kind::input, o.w, "", -1}).back() != tables.d)
        return std::nullopt;  // one head dim for all projections
    auto table_expr = [&](const value_ref& t, const std::vector<int>& bd, size_t rank) {
      std::string e;
      if (t.is_input()) {
        e = args.graph_inputs[static_cast<size_t>(t.id)];
      } else if (t.is_literal()) {
        e = "jnp.float32(" + t.literal + ")";
      } else {
        e = tables.emit(t);
      }
      if (bd.empty())
        return e;
      // the table's dims placed at their broadcast positions, 1 elsewhere
      std::string shape = "(";
      for (size_t a = 0; a < rank; ++a) {
        auto pos = std::find(bd.begin(), bd.end(), static_cast<int>(a));
        shape += pos == bd.end() ? std::string("1")
                                 : fmt::format("{}.shape[{}]", e, pos - bd.begin());
        shape += ", ";
      }
      return fmt::format("jnp.reshape({}, {}))", e, shape);
    };
    std::string result, calls;
    json projections = json::array();
    int64_t total_n = 0, m_rows = 1, e_dim = 0, d_dim = 0;
    for (size_t k = 0; k < outs.size(); ++k) {
      const auto& o = outs[k];
      size_t rank = g.shape(node_value(o.out_node)).size();
      auto xs = g.shape(value_ref{value_ref::kind::input, o.x, "", -1});
      auto ws = g.shape(value_ref{value_ref::kind::input, o.w, "", -1});
      int64_t n = 1;
      for (size_t a = 1; a < ws.size(); ++a)
        n *= ws[a];
      m_rows = 1;
      for (size_t a = 0; a + 1 < xs.size(); ++a)
        m_rows *= xs[a];
      e_dim = xs.back();
      d_dim = ws.back();
      total_n += n;
      auto cos_e = table_expr(o.cos_t, o.cos_dims, rank);
      auto sin_e = table_expr(o.sin_t, o.sin_dims, rank);
      if (cos_e.empty() || sin_e.empty() || !tables.why.empty())
        return std::nullopt;
      calls += fmt::format(
          "    o{} = _rope_mm({}, {}, {}, {}, signs=({:.1f}, {:.1f}), dot_dtype=\"{}\", "
          "acc_round=\"{}\", out_dtype=\"{}\")\n",
          k, args.graph_inputs[static_cast<size_t>(o.x)], args.graph_inputs[static_cast<size_t>(o.w)],
          cos_e, sin_e,
          o.sign_first, o.sign_second, o.dot_dtype, o.acc_round, o.out_dtype);
      result += fmt::format("o{}, ", k);
      projections.push_back({{"m", m_rows}, {"n", n}, {"k", e_dim}, {"d", d_dim}});
    }
    template_match m;
    m.family = name();
    m.summary = fmt::format("{} projection(s) with rotate-half RoPE: {} rows x {} in, {} columns "
                            "in all, head dim {}",
                            outs.size(), m_rows, e_dim, total_n, d_dim);
    m.facts = {{"projections", projections},
               {"rows", m_rows},
               {"k", e_dim},
               {"head_dim", d_dim},
               {"itemsize", outs[0].dot_dtype == "float32" ? 4 : 2}};
    m.facts["generated"] = "def workload(" + args.signature() + "):\n" + tables.code + calls + "    return " +
                           (outs.size() == 1 ? "o0" : "(" + result + ")") + "\n";
    m.score = 2.5;
    return m;
  }

  json initial_params(const template_match& m, const config::chip& chip) const override {
    int64_t d = m.facts.value("head_dim", 128);
    int64_t n_max = 0;
    for (const auto& p : m.facts["projections"])
      n_max = std::max<int64_t>(n_max, p.value("n", 0));
    // big tiles: x is re-read once per column block and W once per row block, so both
    // blocks grow together (compute-bound from about 1024 x 2048 on v6e; bk 1024 halves the
    // accumulator passes and grid steps of bk 512: 0.93x vs 0.89x modeled) under a raised
    // VMEM limit (three quarters of VMEM, within the chip)
    auto vmem = static_cast<int64_t>(chip.vmem_bytes ? chip.vmem_bytes : chip.scoped_vmem_bytes);
    auto limit = std::max<int64_t>(std::min<int64_t>(static_cast<int64_t>(chip.scoped_vmem_bytes), vmem),
                                   std::min<int64_t>(vmem * 3 / 4, int64_t(96) << 20));
    json params = {{"block_m", 2048},
                   {"block_n", std::min<int64_t>(n_max, std::max<int64_t>(d, 2048))},
                   {"block_k", 1024},
                   {"vmem_limit_bytes", limit}};
    auto budget = static_cast<int64_t>(limit * 0.75);
    while (vmem_bytes(m, params) > budget && params["block_k"].get<int64_t>() > 256)
      params["block_k"] = params["block_k"].get<int64_t>() / 2;
    while (vmem_bytes(m, params) > budget && params["block_m"].get<int64_t>() > 128)
      params["block_m"] = params["block_m"].get<int64_t>() / 2;
    while (vmem_bytes(m, params) > budget && params["block_n"].get<int64_t>() > 2 * d)
      params["block_n"] = params["block_n"].get<int64_t>() / 2;
    return params;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    int64_t d = m.facts.value("head_dim", 128);
    int64_t n_max = 0;
    for (const auto& p : m.facts["projections"])
      n_max = std::max<int64_t>(n_max, p.value("n", 0));
    std::vector<tunable> t;
    tunable bm;
    bm.name = "block_m";
    bm.extent = m.facts.value("rows", 1);
    bm.align = m.facts.value("itemsize", 2) == 4 ? 8 : 16;
    bm.grid_axis = 0;
    bm.meaning = "rows (tokens) per block";
    t.push_back(bm);
    tunable bn;
    bn.name = "block_n";
    bn.extent = n_max;
    bn.align = d * 128 / std::gcd<int64_t>(d, 128);
    bn.grid_axis = 1;
    bn.meaning = "output columns per block (whole heads)";
    t.push_back(bn);
    tunable bk;
    bk.name = "block_k";
    bk.extent = m.facts.value("k", 1);
    bk.align = 128;
    bk.grid_axis = 2;
    bk.reduction = true;
    bk.meaning = "contraction per step";
    t.push_back(bk);
    tunable vl;
    vl.name = "vmem_limit_bytes";
    vl.what = tunable::kind::choice;
    for (int64_t mib : {16, 32, 48, 64, 96})
      vl.choices.push_back(mib * 1024 * 1024);
    vl.meaning = "scoped VMEM limit of the kernel";
    t.push_back(vl);
    return t;
  }

  int64_t vmem_bytes(const template_match& m, const json& params) const override {
    int64_t it = m.facts.value("itemsize", 2), d = m.facts.value("head_dim", 128);
    int64_t rows = m.facts.value("rows", 1), kd = m.facts.value("k", 1);
    int64_t most = 0;
    for (const auto& p : m.facts["projections"]) {
      int64_t bm = effective_block(rows, 8, params.value("block_m", 512));
      int64_t bn = effective_block(p.value("n", 1), 128, params.value("block_n", 1024));
      int64_t bk = effective_block(kd, 128, params.value("block_k", 1024));
      int64_t bytes = 2 * (bm * bk * it + bk * bn * it + bm * bn * it + 2 * bm * d * 4) + bm * bn * 4;
      most = std::max(most, bytes);
    }
    return most;
  }

  bool render(const template_match& m, const json& params, std::string& source,
              std::string& error) const override {
    std::map<std::string, std::string> values = {{"summary", m.summary}, {"params", params.dump()}};
    for (const char* key : {"block_m", "block_n", "block_k", "vmem_limit_bytes"}) {
      if (!params.contains(key) || !params[key].is_number_integer() || params[key].get<int64_t>() <= 0) {
        error = fmt::format("rope_projection: parameter {} must be a positive integer", key);
        return false;
      }
      values[key] = std::to_string(params[key].get<int64_t>());
    }
    values["generated"] = m.facts.value("generated", std::string());
    return fill_template("rope_projection.py", values, source, error);
  }
};

}  // namespace

template_ptr make_rope_projection_template() {
  return std::make_shared<rope_projection_template>();
}

}  // namespace maxkernel::agents::expert
