#include "agents/expert/attention_codegen.hpp"

#include "agents/expert/block_size.hpp"
#include "agents/expert/replay_program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace maxkernel::agents::expert {

int attention_dtype_bytes(const std::string& d) {
  if (d == "bfloat16" || d == "float16" || d == "int16" || d == "uint16")
    return 2;
  if (d == "int8" || d == "uint8" || d == "bool" || d.rfind("float8", 0) == 0)
    return 1;
  if (d == "float64" || d == "int64" || d == "uint64")
    return 8;
  return 4;
}

namespace {

bool contains(const index_list& l, int x) { return std::find(l.begin(), l.end(), x) != l.end(); }

index_list flatten(const axis_indices& axes) {
  index_list out;
  for (const auto& a : axes)
    out.insert(out.end(), a.begin(), a.end());
  return out;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? sep : "") + v[i];
  return out;
}

std::string tuple(const std::vector<std::string>& v) {
  if (v.empty())
    return "()";
  return "(" + join(v, ", ") + (v.size() == 1 ? ",)" : ")");
}

std::string operand_dtype(const graph_view& g, int node, unsigned k) {
  return g.node(node).getOperands()[k].getDtype().cStr();
}

std::string result_dtype(const graph_view& g, int node) {
  auto r = g.node(node).getResults();
  return r.size() ? std::string(r[0].getDtype().cStr()) : std::string();
}

bool is_float_dtype(const std::string& d) {
  return d.rfind("float", 0) == 0 || d == "bfloat16";
}

bool is_16bit_float(const std::string& d) { return d == "bfloat16" || d == "float16"; }

// A literal's numeric value (-inf etc. from their string form); NaN when not numeric.
double literal_value(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_number())
    return j.get<double>();
  if (j.is_string()) {
    auto s = j.get<std::string>();
    if (s == "-inf")
      return -INFINITY;
    if (s == "inf")
      return INFINITY;
  }
  if (j.is_boolean())
    return j.get<bool>() ? 1.0 : 0.0;
  return NAN;
}

bool large_negative(const std::string& json) {
  double v = literal_value(json);
  return !std::isnan(v) && v <= -1e4;
}

std::string k_and(const std::string& a, const std::string& b) {
  if (a == "False" || b == "False")
    return "False";
  if (a == "True")
    return b;
  if (b == "True")
    return a;
  return "(" + a + " & " + b + ")";
}

std::string k_or(const std::string& a, const std::string& b) {
  if (a == "True" || b == "True")
    return "True";
  if (a == "False")
    return b;
  if (b == "False")
    return a;
  return "(" + a + " | " + b + ")";
}

std::string k_not(const std::string& a) {
  if (a == "True")
    return "False";
  if (a == "False")
    return "True";
  return "(~" + a + ")";
}

}  // namespace

attention_codegen::attention_codegen(const graph_view& g, const attention_pattern& p,
                                     schema::KernelSpec::Reader spec)
    : g_(g), p_(p), spec_(spec) {}

std::string attention_codegen::size_of(int leaf) const {
  auto it = size_expr_.find(leaf);
  return it == size_expr_.end() ? std::string("None") : "n" + std::to_string(leaf);
}

int attention_codegen::c_axis(int leaf) const {
  auto it = std::find(p_.kv_rows.begin(), p_.kv_rows.end(), leaf);
  return it == p_.kv_rows.end() ? -1 : static_cast<int>(it - p_.kv_rows.begin());
}

std::string attention_codegen::arg(int input) const {
  if (input < 0 || static_cast<size_t>(input) >= spec_index_.size())
    return "None";
  return "a" + std::to_string(spec_index_[static_cast<size_t>(input)]);
}

std::string attention_codegen::signature() const {
  std::vector<std::string> names;
  auto inputs = spec_.getConfigurations()[0].getInputs();
  for (unsigned i = 0; i < inputs.size(); ++i)
    names.push_back("a" + std::to_string(i));
  return join(names, ", ");
}

std::string attention_codegen::c_sizes() const {
  std::vector<std::string> v;
  for (int l : p_.kv_rows)
    v.push_back(size_of(l));
  return tuple(v);
}

std::string attention_codegen::rows_size() const {
  std::vector<std::string> v;
  for (int l : p_.q_rows)
    v.push_back(size_of(l));
  return v.empty() ? "1" : join(v, " * ");
}

std::string attention_codegen::keys_size() const {
  std::vector<std::string> v;
  for (int l : p_.keys)
    v.push_back(size_of(l));
  return join(v, " * ");
}

int64_t attention_codegen::rows_extent() const { return p_.space.product(p_.q_rows); }
int64_t attention_codegen::keys_extent() const { return p_.space.product(p_.keys); }
int64_t attention_codegen::value_extent() const { return p_.space.product(p_.value_dims); }

std::vector<int64_t> attention_codegen::qk_dims() const {
  std::vector<int64_t> out;
  for (const auto& t : p_.terms)
    out.push_back(p_.space.product(t.contraction));
  return out;
}

bool attention_codegen::solve_sizes(std::string& why) {
  struct source {
    std::string var;
    const axis_indices* axes;
  };
  std::vector<source> sources;
  for (const auto& t : p_.terms) {
    if (!base_expr(t.q.base).empty())
      sources.push_back({base_expr(t.q.base), &t.q.axes});
    if (!external_kv_ && !base_expr(t.k.base).empty())
      sources.push_back({base_expr(t.k.base), &t.k.axes});
  }
  if (!external_kv_ && !base_expr(p_.v.base).empty())
    sources.push_back({base_expr(p_.v.base), &p_.v.axes});
  for (const auto& u : p_.region_inputs)
    sources.push_back({arg(u.input), &u.axes});
  for (const auto& [var, axes] : extra_sources_)
    sources.push_back({var, &axes});
  bool progress = true;
  while (progress) {
    progress = false;
    for (const auto& s : sources)
      for (size_t a = 0; a < s.axes->size(); ++a) {
        const auto& leaves = (*s.axes)[a];
        int unknown = -1, n_unknown = 0;
        std::vector<std::string> known;
        for (int l : leaves) {
          if (size_expr_.count(l))
            known.push_back(size_of(l));
          else {
            unknown = l;
            ++n_unknown;
          }
        }
        if (n_unknown != 1)
          continue;
        std::string e = fmt::format("{}.shape[{}]", s.var, a);
        if (!known.empty())
          e += " // (" + join(known, " * ") + ")";
        size_expr_[unknown] = e;
        sizes_code_ += fmt::format("n{} = {}\n", unknown, e);
        progress = true;
      }
  }
  auto need = [&](const index_list& l) {
    for (int x : l)
      if (!size_expr_.count(x)) {
        why = "cannot read the size of an attention index from the inputs";
        return false;
      }
    return true;
  };
  if (!need(p_.keys) || !need(p_.kv_rows) || !need(p_.q_rows) || !need(p_.value_dims))
    return false;
  for (const auto& t : p_.terms)
    if (!need(t.contraction))
      return false;
  return true;
}

bool attention_codegen::make_view(const std::string& var, const std::string& base,
                                  const axis_indices& base_axes, const index_list& sub,
                                  const char* sub_kind, const index_list& lane,
                                  bool lane_merge_ok, bool output, operand_view& out,
                                  std::string& why) {
  index_list F = flatten(base_axes);
  for (int l : F)
    if (c_axis(l) < 0 && !contains(sub, l) && !contains(lane, l)) {
      why = "an operand depends on an index it should not (" + leaf_role(p_, l) + ")";
      return false;
    }
  for (int l : sub)
    if (!contains(F, l)) {
      why = "an operand lacks a row or key index";
      return false;
    }
  for (int l : lane)
    if (!contains(F, l)) {
      why = "an operand lacks its head dimension";
      return false;
    }
  index_list P, M;
  bool ok = F.size() >= lane.size() && std::equal(lane.begin(), lane.end(), F.end() - static_cast<long>(lane.size()));
  if (ok) {
    index_list Fp(F.begin(), F.end() - static_cast<long>(lane.size()));
    if (!sub.empty()) {
      auto it = std::find(Fp.begin(), Fp.end(), sub[0]);
      size_t pos = static_cast<size_t>(it - Fp.begin());
      ok = it != Fp.end() && pos + sub.size() <= Fp.size() &&
           std::equal(sub.begin(), sub.end(), Fp.begin() + static_cast<long>(pos));
      if (ok) {
        P.assign(Fp.begin(), Fp.begin() + static_cast<long>(pos));
        M.assign(Fp.begin() + static_cast<long>(pos + sub.size()), Fp.end());
      }
    } else {
      P = Fp;
    }
    if (ok && !M.empty())
      ok = lane_merge_ok && !lane.empty() && p_.space.product(lane) % 128 == 0;
  }
  out.transposed = !ok;
  index_list order;
  if (!ok) {
    P.clear();
    M.clear();
    for (int l : F)
      if (!contains(sub, l) && !contains(lane, l))
        P.push_back(l);
  }
  order = P;
  order.insert(order.end(), sub.begin(), sub.end());
  order.insert(order.end(), M.begin(), M.end());
  order.insert(order.end(), lane.begin(), lane.end());
  // the view's axes
  axis_indices view_groups;
  std::vector<std::string> view_shape, axes;
  for (int l : P) {
    view_groups.push_back({l});
    view_shape.push_back(size_of(l));
    axes.push_back(fmt::format("(\"c\", {})", c_axis(l)));
    out.lead_c.push_back(c_axis(l));
  }
  view_groups.push_back(sub);
  if (sub.empty()) {
    view_shape.push_back("1");
    axes.push_back("(\"unit\",)");
  } else {
    std::vector<std::string> s;
    for (int l : sub)
      s.push_back(size_of(l));
    view_shape.push_back(join(s, " * "));
    axes.push_back(fmt::format("(\"{}\",)", sub_kind));
  }
  index_list lane_group = M;
  lane_group.insert(lane_group.end(), lane.begin(), lane.end());
  view_groups.push_back(lane_group);
  if (lane_group.empty()) {
    view_shape.push_back("1");
    axes.push_back("(\"unit\",)");
  } else {
    std::vector<std::string> s;
    for (int l : lane_group)
      s.push_back(size_of(l));
    view_shape.push_back(join(s, " * "));
    if (!M.empty()) {
      std::vector<std::string> cs;
      for (int l : M) {
        cs.push_back(std::to_string(c_axis(l)));
        out.lane_c.push_back(c_axis(l));
      }
      axes.push_back("(\"lane\", " + tuple(cs) + ")");
    } else {
      // a mask or bias tile is blocked along its keys; a head dimension is read whole
      bool keys_lane = !lane.empty() && contains(p_.keys, lane[0]);
      axes.push_back(keys_lane ? "(\"keys\",)" : "(\"full\",)");
    }
  }
  out.var = var;
  out.axes = "[" + join(axes, ", ") + "]";
  out.shape = tuple(view_shape);
  std::vector<std::string> leaf_shape, base_shape;
  axis_indices per_leaf;
  for (int l : (out.transposed ? F : order)) {
    leaf_shape.push_back(size_of(l));
    per_leaf.push_back({l});
  }
  for (const auto& a : base_axes) {
    std::vector<std::string> s;
    for (int l : a)
      s.push_back(size_of(l));
    base_shape.push_back(s.empty() ? "1" : join(s, " * "));
  }
  std::vector<int> perm;
  for (int l : order)
    perm.push_back(static_cast<int>(std::find(F.begin(), F.end(), l) - F.begin()));
  std::vector<std::string> perm_s, inv_s(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    perm_s.push_back(std::to_string(perm[i]));
    inv_s[static_cast<size_t>(perm[i])] = std::to_string(i);
  }
  std::string code;
  if (!output) {
    code = var + " = " + base + "\n";
    if (out.transposed) {
      if (base_axes != per_leaf)
        code += fmt::format("{0} = {0}.reshape({1})\n", var, tuple(leaf_shape));
      code += fmt::format("{0} = jnp.transpose({0}, {1})\n", var, tuple(perm_s));
      axis_indices ordered;
      for (int l : order)
        ordered.push_back({l});
      if (view_groups != ordered)
        code += fmt::format("{0} = {0}.reshape({1})\n", var, out.shape);
    } else if (view_groups != base_axes) {
      code += fmt::format("{0} = {0}.reshape({1})\n", var, out.shape);
    }
  } else {
    // var (the view) -> the base layout, assigned to `base`
    code = base + " = " + var + "\n";
    if (out.transposed) {
      axis_indices ordered;
      std::vector<std::string> ordered_shape;
      for (int l : order) {
        ordered.push_back({l});
        ordered_shape.push_back(size_of(l));
      }
      if (view_groups != ordered)
        code += fmt::format("{0} = {0}.reshape({1})\n", base, tuple(ordered_shape));
      code += fmt::format("{0} = jnp.transpose({0}, {1})\n", base, tuple(inv_s));
      if (base_axes != per_leaf)
        code += fmt::format("{0} = {0}.reshape({1})\n", base, tuple(base_shape));
    } else if (view_groups != base_axes) {
      code += fmt::format("{0} = {0}.reshape({1})\n", base, tuple(base_shape));
    }
  }
  out.code = code;
  return true;
}

std::string attention_codegen::literal(const std::string& json, const std::string& dtype,
                                       bool in_region) const {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_boolean())
    return j.get<bool>() ? "True" : "False";
  if (j.is_string()) {
    auto s = j.get<std::string>();
    return "float(\"" + s + "\")";
  }
  if (j.is_number() && is_float_dtype(dtype)) {
    auto f = size_formula(j.get<double>());
    if (!f.empty())
      return f;
  }
  if (j.is_number_integer() || (j.is_number() && !is_float_dtype(dtype) && dtype != "bool")) {
    long long v = j.is_number_integer() ? j.get<long long>() : static_cast<long long>(j.get<double>());
    // A position offset (a window, a number of global tokens) that divides the key length
    // is read as that fraction of it, so the mask keeps its shape at reduced test sizes.
    int64_t keys = keys_extent();
    if (in_region && !is_float_dtype(dtype) && v >= 16 && keys > 0 && v <= keys &&
        keys % v == 0)
      return fmt::format("({} // {})", keys_size(), keys / v);
    return std::to_string(v);
  }
  if (j.is_number()) {
    double d = j.get<double>();
    if (std::isinf(d))
      return d < 0 ? "float(\"-inf\")" : "float(\"inf\")";
    return nlohmann::json(d).dump();
  }
  return "None";
}

void attention_codegen::collect_feature_sizes() {
  // a value behind casts
  auto strip_casts = [&](value_ref v) {
    while (v.is_node() && g_.primitive(v.id) == "convert_element_type")
      v = g_.operand(v.id, 0);
    return v;
  };
  for (const auto& t : p_.terms) {
    std::vector<std::pair<int64_t, std::string>> opts;
    std::vector<std::string> e;
    for (int l : t.contraction)
      e.push_back(size_of(l));
    opts.push_back({p_.space.product(t.contraction), join(e, " * ")});
    // the query computed by a projection in the reference (MLA's absorbed W_UK): its
    // contraction, read from the shape of a graph input it contracts
    value_ref q = strip_casts(t.q.base);
    if (q.is_node() && g_.primitive(q.id) == "dot_general") {
      const auto& dp = g_.params(q.id);
      for (unsigned side = 0; side < 2; ++side) {
        value_ref o = strip_casts(g_.operand(q.id, side));
        auto dims = dp.value(side == 0 ? "lhs_contracting" : "rhs_contracting", nlohmann::json());
        if (!o.is_input() || !dims.is_array() || dims.empty())
          continue;
        auto shape = to_vector(g_.input_type(static_cast<unsigned>(o.id)).getShape());
        int64_t size = 1;
        std::vector<std::string> parts;
        bool ok = true;
        for (const auto& d : dims) {
          if (!d.is_number_integer() || d.get<int>() < 0 ||
              static_cast<size_t>(d.get<int>()) >= shape.size()) {
            ok = false;
            break;
          }
          size *= shape[static_cast<size_t>(d.get<int>())];
          parts.push_back(fmt::format("{}.shape[{}]", arg(o.id), d.get<int>()));
        }
        if (ok)
          opts.push_back({size, join(parts, " * ")});
        break;
      }
    }
    feature_sizes_.push_back(std::move(opts));
  }
}

std::string attention_codegen::size_formula(double value, bool plain) const {
  if (!std::isfinite(value) || value <= 0 || value == 1.0 || feature_sizes_.empty())
    return "";
  // every choice of at most one feature size per term, summed
  std::set<std::string> found;
  std::vector<int> pick(feature_sizes_.size(), -1);
  while (true) {
    size_t i = 0;
    while (i < pick.size() && ++pick[i] >= static_cast<int>(feature_sizes_[i].size())) {
      pick[i] = -1;
      ++i;
    }
    if (i == pick.size())
      break;
    int64_t d = 0;
    std::vector<std::string> parts;
    for (size_t t = 0; t < pick.size(); ++t)
      if (pick[t] >= 0) {
        d += feature_sizes_[t][static_cast<size_t>(pick[t])].first;
        parts.push_back(feature_sizes_[t][static_cast<size_t>(pick[t])].second);
      }
    if (d < 8)
      continue;
    std::string e = join(parts, " + ");
    auto dd = static_cast<double>(d);
    auto near = [&](double x) { return std::abs(x - value) <= 1e-6 * value; };
    if (plain) {
      if (near(dd))
        found.insert(fmt::format("float({})", e));
    } else if (near(1.0 / std::sqrt(dd)))
      found.insert(fmt::format("float(({}) ** -0.5)", e));
    else if (near(std::sqrt(dd)))
      found.insert(fmt::format("float(({}) ** 0.5)", e));
    else if (near(1.0 / dd))
      found.insert(fmt::format("(1.0 / ({}))", e));
  }
  return found.size() == 1 ? *found.begin() : "";
}

std::string attention_codegen::ew_expr(int node, const std::vector<std::string>& o,
                                       std::string& why) const {
  auto p = g_.primitive(node);
  const auto& params = g_.params(node);
  std::string rd = result_dtype(g_, node);
  bool flt = is_float_dtype(rd);
  auto un = [&](const char* f) { return fmt::format("xp.{}({})", f, o[0]); };
  if ((p == "add" || p == "add_any") && !flt && o[1] == "0") return o[0];
  if ((p == "add" || p == "add_any") && !flt && o[0] == "0") return o[1];
  if (p == "add" || p == "add_any") return "(" + o[0] + " + " + o[1] + ")";
  if (p == "sub") return "(" + o[0] + " - " + o[1] + ")";
  if (p == "mul") return "(" + o[0] + " * " + o[1] + ")";
  if (p == "div") return flt ? "(" + o[0] + " / " + o[1] + ")" : "xp.idiv(" + o[0] + ", " + o[1] + ")";
  if (p == "rem") return "xp.fmod(" + o[0] + ", " + o[1] + ")";
  if (p == "max") return "xp.maximum(" + o[0] + ", " + o[1] + ")";
  if (p == "min") return "xp.minimum(" + o[0] + ", " + o[1] + ")";
  if (p == "neg") return "(-" + o[0] + ")";
  if (p == "not") return "(~" + o[0] + ")";
  if (p == "and") return "(" + o[0] + " & " + o[1] + ")";
  if (p == "or") return "(" + o[0] + " | " + o[1] + ")";
  if (p == "xor") return "(" + o[0] + " ^ " + o[1] + ")";
  if (p == "eq") return "(" + o[0] + " == " + o[1] + ")";
  if (p == "ne") return "(" + o[0] + " != " + o[1] + ")";
  if (p == "lt") return "(" + o[0] + " < " + o[1] + ")";
  if (p == "le") return "(" + o[0] + " <= " + o[1] + ")";
  if (p == "gt") return "(" + o[0] + " > " + o[1] + ")";
  if (p == "ge") return "(" + o[0] + " >= " + o[1] + ")";
  if (p == "shift_left") return "(" + o[0] + " << " + o[1] + ")";
  if (p == "shift_right_arithmetic") return "(" + o[0] + " >> " + o[1] + ")";
  if (p == "square") return "(" + o[0] + " * " + o[0] + ")";
  if (p == "reciprocal") return "(1 / " + o[0] + ")";
  if (p == "select_n") {
    if (o.size() != 3) {
      why = "select_n with more than two cases";
      return "";
    }
    std::string pred = operand_dtype(g_, node, 0) == "bool" ? o[0] : "(" + o[0] + " != 0)";
    if (o[1] == "False" && o[2] == "True")
      return pred;
    if (o[1] == "True" && o[2] == "False")
      return "(~" + pred + ")";
    return "xp.where(" + pred + ", " + o[2] + ", " + o[1] + ")";
  }
  if (p == "clamp") return "xp.clip(" + o[1] + ", " + o[0] + ", " + o[2] + ")";
  if (p == "convert_element_type") return "xp.cast(" + o[0] + ", \"" + rd + "\")";
  if (p == "stop_gradient" || p == "copy" || p == "copy_p" || p == "reduce_precision" ||
      p == "optimization_barrier")
    return o[0];
  if (p == "integer_pow") {
    int y = params.value("y", 1);
    if (y >= 0)
      return "(" + o[0] + " ** " + std::to_string(y) + ")";
    return "(1 / (" + o[0] + " ** " + std::to_string(-y) + "))";
  }
  if (p == "pow") return "xp.power(" + o[0] + ", " + o[1] + ")";
  if (p == "atan2") return "xp.arctan2(" + o[0] + ", " + o[1] + ")";
  if (p == "round") {
    auto m = params.value("rounding_method", nlohmann::json());
    bool even = (m.is_number() && m.get<int>() == 1) || (m.is_string() && m.get<std::string>().find("EVEN") != std::string::npos);
    if (even) return un("round");
    return fmt::format("(xp.sign({0}) * xp.floor(xp.abs({0}) + 0.5))", o[0]);
  }
  static const std::map<std::string, std::string> unary = {
    {"exp", "exp"}, {"log", "log"}, {"log1p", "log1p"}, {"expm1", "expm1"}, {"tanh", "tanh"},
    {"logistic", "logistic"}, {"sqrt", "sqrt"}, {"rsqrt", "rsqrt"}, {"sin", "sin"},
    {"cos", "cos"}, {"tan", "tan"}, {"abs", "abs"}, {"sign", "sign"}, {"floor", "floor"},
    {"ceil", "ceil"}, {"is_finite", "isfinite"}, {"erf", "erf"}};
  auto it = unary.find(p);
  if (it != unary.end())
    return un(it->second.c_str());
  why = "the score function uses " + p;
  return "";
}

std::string attention_codegen::const_expr(const value_ref& v, const std::string& dtype,
                                          std::string& why) const {
  if (v.is_literal())
    return "xp.cast(" + literal(v.literal, dtype, false) + ", \"" + dtype + "\")";
  if (!v.is_node()) {
    why = "unknown constant";
    return "";
  }
  int n = v.id;
  auto prim = g_.primitive(n);
  if (is_layout_primitive(prim))
    return const_expr(g_.operand(n, 0), operand_dtype(g_, n, 0), why);
  std::vector<std::string> ops;
  for (unsigned k = 0; k < g_.operand_count(n); ++k) {
    auto f = root_formula(n, k);
    ops.push_back(!f.empty() ? f : const_expr(g_.operand(n, k), operand_dtype(g_, n, k), why));
    if (ops.back().empty())
      return "";
  }
  auto e = ew_expr(n, ops, why);
  if (e.empty())
    return "";
  return "xp.cast(" + e + ", \"" + result_dtype(g_, n) + "\")";
}

// The positions an iota holds, read with index map `axes`, as code over the block's ix.
std::string attention_codegen::iota_expr(int n, const axis_indices& axes, std::string& why) const {
  int dim = g_.params(n).value("dimension", 0);
  if (dim < 0 || static_cast<size_t>(dim) >= axes.size()) {
    why = "iota dimension out of range";
    return "";
  }
  const auto& leaves = axes[static_cast<size_t>(dim)];
  std::string acc;
  for (size_t i = 0; i < leaves.size(); ++i) {
    int l = leaves[i];
    std::string idx, size = size_of(l);
    if (contains(p_.keys, l)) {
      // the key position: every key leaf, in order (a page slot and a row of the page)
      if (l != p_.keys[0] || i + p_.keys.size() > leaves.size() ||
          !std::equal(p_.keys.begin(), p_.keys.end(), leaves.begin() + static_cast<long>(i))) {
        why = "a position over part of the keys";
        return "";
      }
      i += p_.keys.size() - 1;
      idx = "ix.k()";
      size = "(" + keys_size() + ")";
    } else if (c_axis(l) >= 0) {
      idx = fmt::format("ix.c({})", c_axis(l));
    } else if (contains(p_.q_rows, l)) {
      std::vector<std::string> stride;
      auto it = std::find(p_.q_rows.begin(), p_.q_rows.end(), l);
      for (++it; it != p_.q_rows.end(); ++it)
        stride.push_back(size_of(*it));
      idx = fmt::format("ix.r({}, {})", stride.empty() ? "1" : join(stride, " * "), size_of(l));
    } else {
      why = "a position over a head dimension";
      return "";
    }
    acc = acc.empty() ? idx : "(" + acc + " * " + size + " + " + idx + ")";
  }
  if (acc.empty())
    acc = "0";
  std::string dt = g_.params(n).value("dtype", std::string("int32"));
  return dt == "int32" ? acc : "xp.cast(" + acc + ", \"" + dt + "\")";
}

std::string attention_codegen::root_formula(int node, unsigned k) const {
  auto prim = g_.primitive(node);
  if (prim != "sqrt" && prim != "rsqrt")
    return "";
  auto o = g_.operand(node, k);
  while (o.is_node() && g_.primitive(o.id) == "convert_element_type")
    o = g_.operand(o.id, 0);
  if (!o.is_literal())
    return "";
  auto f = size_formula(literal_value(o.literal), true);
  return f.empty() ? f : "xp.cast(" + f + ", \"" + operand_dtype(g_, node, k) + "\")";
}

std::string attention_codegen::region_operand(int node, unsigned k, std::string& why) const {
  auto o = g_.operand(node, k);
  auto root = root_formula(node, k);
  if (!root.empty())
    return root;
  if (o.is_literal())
    return literal(o.literal, operand_dtype(g_, node, k), true);
  if (o.is_input()) {
    auto it = input_use_.find({node, k});
    if (it == input_use_.end()) {
      why = "an input of the score function has no view";
      return "";
    }
    return it->second;
  }
  if (o.is_node()) {
    auto r = p_.iota_reads.find({node, k});
    if (r != p_.iota_reads.end())
      return iota_expr(o.id, r->second, why);
    auto a = alias_.find(o.id);
    if (a != alias_.end())
      return a->second;
    auto t = term_of_dot_.find(o.id);
    if (t != term_of_dot_.end())
      return "s[" + std::to_string(t->second) + "]";
    if (is_constant_scalar(g_, o) && !p_.region_axes.count(o.id))
      return const_expr(o, operand_dtype(g_, node, k), why);
    return "v" + std::to_string(o.id);
  }
  why = "a score operand of unknown origin";
  return "";
}

bool attention_codegen::emit_region(std::string& why) {
  // purity: a region value that depends on neither the scores nor a tile input
  for (int n : p_.region) {
    bool impure = false;
    for (unsigned k = 0; k < g_.operand_count(n); ++k) {
      auto o = g_.operand(n, k);
      if (o.is_node() && (term_of_dot_.count(o.id) || impure_.count(o.id)))
        impure = true;
      if (o.is_input()) {
        auto it = input_use_.find({n, k});
        if (it != input_use_.end() && it->second.find("ix.t(") != std::string::npos)
          impure = true;
      }
    }
    if (impure)
      impure_.insert(n);
  }
  auto node_line = [&](int n, std::string& line) {
    auto prim = g_.primitive(n);
    std::string e;
    if (prim == "iota") {
      e = iota_expr(n, p_.region_axes.at(n), why);
      if (e.empty())
        return false;
    } else if (is_layout_primitive(prim)) {
      // tiles broadcast by their index roles: a layout op is the value itself
      e = region_operand(n, 0, why);
      if (e.empty())
        return false;
      alias_[n] = e;
      line.clear();
      return true;
    } else {
      std::vector<std::string> ops;
      for (unsigned k = 0; k < g_.operand_count(n); ++k) {
        ops.push_back(region_operand(n, k, why));
        if (ops.back().empty())
          return false;
      }
      e = ew_expr(n, ops, why);
      ++score_ops_;
    }
    if (e.empty())
      return false;
    if (g_.shape(value_ref{value_ref::kind::node, n, ""}).empty() && prim != "iota")
      e = "xp.cast(" + e + ", \"" + result_dtype(g_, n) + "\")";
    line = fmt::format("    v{} = {}\n", n, e);
    return true;
  };
  std::string score = "def _score(s, ix, xp):\n";
  for (int n : p_.region) {
    std::string line;
    if (!node_line(n, line))
      return false;
    score += line;
  }
  std::string s_expr;
  if (p_.scores.is_node() && term_of_dot_.count(p_.scores.id))
    s_expr = "s[" + std::to_string(term_of_dot_.at(p_.scores.id)) + "]";
  else if (alias_.count(p_.scores.id))
    s_expr = alias_.at(p_.scores.id);
  else
    s_expr = "v" + std::to_string(p_.scores.id);
  score += "    return " + s_expr + "\n";
  functions_ += score + "\n\n";
  // the mask: where the scores are surely -inf (or a large negative fill)
  std::string kill = kill_of(p_.scores);
  has_kill_ = kill != "False";
  if (!has_kill_)
    return true;
  // the pure nodes the mask reads, and what they depend on
  std::set<int> support = region_reach({kill_refs_.begin(), kill_refs_.end()}, {});
  std::set<int> c_used;
  for (int n : support) {
    if (impure_.count(n)) {
      has_kill_ = false;  // cannot happen: refs are pure; stay safe
      return true;
    }
    auto note_iota = [&](int iota, const axis_indices& axes) {
      int dim = g_.params(iota).value("dimension", 0);
      if (dim < 0 || static_cast<size_t>(dim) >= axes.size())
        return;
      for (int l : axes[static_cast<size_t>(dim)]) {
        if (c_axis(l) >= 0)
          c_used.insert(c_axis(l));
        if (contains(p_.q_rows, l))
          kill_rows_ = true;
      }
    };
    if (g_.primitive(n) == "iota")
      note_iota(n, p_.region_axes.at(n));
    for (unsigned k = 0; k < g_.operand_count(n); ++k) {
      auto o = g_.operand(n, k);
      auto r = p_.iota_reads.find({n, k});
      if (r != p_.iota_reads.end())
        note_iota(o.id, r->second);
      if (!o.is_input())
        continue;
      kill_static_ = false;
      auto it = input_use_.find({n, k});
      auto at = it == input_use_.end() ? std::string::npos : it->second.find("ix.s(");
      if (at != std::string::npos) {
        int j = std::stoi(it->second.substr(at + 5));
        for (int c : scalar_c_[static_cast<size_t>(j)])
          c_used.insert(c);
      }
    }
  }
  kill_c_.assign(c_used.begin(), c_used.end());
  std::string kf = "def _kill(ix, xp):\n";
  for (int n : p_.region)
    if (support.count(n)) {
      std::string line;
      if (!node_line(n, line))
        return false;
      kf += line;
    }
  kf += "    return " + kill + "\n";
  functions_ += kf + "\n\n";

  // The scores of a block the mask leaves whole: the mask's selects on their live branch,
  // and only what that still reads (the positions a causal mask compares are not computed).
  std::map<int, unsigned> live;
  mark_live_selects(p_.scores, live);
  if (live.empty())
    return true;
  std::set<int> needed = region_reach({p_.scores.id}, live);  // live: scores is a node
  std::string lf = "def _score_live(s, ix, xp):\n";
  int ops_before = score_ops_;
  for (int n : p_.region) {
    if (!needed.count(n))
      continue;
    std::string line;
    auto it = live.find(n);
    if (it != live.end()) {
      std::string e = region_operand(n, it->second, why);
      if (e.empty())
        return false;
      line = fmt::format("    v{} = {}\n", n, e);
    } else if (!node_line(n, line)) {
      return false;
    }
    lf += line;
  }
  score_ops_ = ops_before;
  lf += "    return " + s_expr + "\n";
  functions_ += lf + "\n\n";
  has_live_score_ = true;
  return true;
}

std::string attention_codegen::kill_of(const value_ref& v) {
  if (v.is_literal())
    return large_negative(v.literal) ? "True" : "False";
  if (!v.is_node() || term_of_dot_.count(v.id) || !p_.region_axes.count(v.id))
    return "False";
  auto it = kill_memo_.find(v.id);
  if (it != kill_memo_.end())
    return it->second;
  auto r = kill_node(v.id);
  kill_memo_[v.id] = r;
  return r;
}

std::set<int> attention_codegen::region_reach(const std::vector<int>& roots,
                                              const std::map<int, unsigned>& only) const {
  std::set<int> seen;
  std::function<void(int)> visit = [&](int n) {
    if (seen.count(n) || !p_.region_axes.count(n) || term_of_dot_.count(n))
      return;
    seen.insert(n);
    auto it = only.find(n);
    for (unsigned k = 0; k < g_.operand_count(n); ++k) {
      auto o = g_.operand(n, k);
      if (o.is_node() && (it == only.end() || k == it->second))
        visit(o.id);
    }
  };
  for (int n : roots)
    visit(n);
  return seen;
}

std::string attention_codegen::pure_predicate(int n) const {
  auto pred = g_.operand(n, 0);
  bool pure = pred.is_literal() || (pred.is_node() && !impure_.count(pred.id) &&
                                    !term_of_dot_.count(pred.id));
  if (pred.is_input()) {
    auto it = input_use_.find({n, 0});
    pure = it != input_use_.end() && it->second.find("ix.s(") != std::string::npos;
  }
  if (!pure || operand_dtype(g_, n, 0) != "bool")
    return "";
  std::string why;
  return region_operand(n, 0, why);
}

unsigned attention_codegen::live_branch(int n) {
  if (g_.primitive(n) != "select_n" || g_.operand_count(n) != 3 || pure_predicate(n).empty())
    return 0;
  std::string ka = kill_of(g_.operand(n, 1)), kb = kill_of(g_.operand(n, 2));
  if (ka == "True" && kb != "True")
    return 2;
  if (kb == "True" && ka != "True")
    return 1;
  return 0;
}

void attention_codegen::mark_live_selects(const value_ref& v, std::map<int, unsigned>& live) {
  if (!v.is_node() || term_of_dot_.count(v.id) || !p_.region_axes.count(v.id) ||
      live.count(v.id))
    return;
  int n = v.id;
  // Only through kill_node's ors (the result is killed wherever this operand is): there a
  // block the mask leaves whole has every such select on its live branch.
  if (auto ors = kill_or_operands(n)) {
    for (unsigned k : *ors)
      mark_live_selects(g_.operand(n, k), live);
  } else if (unsigned b = live_branch(n)) {
    live[n] = b;
    mark_live_selects(g_.operand(n, b), live);
  }
}

std::optional<std::vector<unsigned>> attention_codegen::kill_or_operands(int n) const {
  auto p = g_.primitive(n);
  if (is_layout_primitive(p) || p == "convert_element_type" || p == "stop_gradient" ||
      p == "copy" || p == "copy_p" || p == "reduce_precision" || p == "sub")
    return std::vector<unsigned>{0};
  if (p == "add" || p == "add_any" || p == "min")
    return std::vector<unsigned>{0, 1};
  if (p == "mul" || p == "div") {
    // a positive constant factor (or divisor) keeps -inf; anything else kills nothing
    for (unsigned k = 0; k < 2; ++k) {
      auto c = g_.operand(n, k);
      if (!c.is_literal())
        continue;
      if (literal_value(c.literal) > 0 && !(p == "div" && k == 0))
        return std::vector<unsigned>{1 - k};
      break;
    }
    return std::vector<unsigned>{};
  }
  return std::nullopt;
}

std::string attention_codegen::kill_node(int n) {
  auto p = g_.primitive(n);
  auto op = [&](unsigned k) { return g_.operand(n, k); };
  if (auto ors = kill_or_operands(n)) {
    std::string kill = "False";
    for (unsigned k : *ors)
      kill = k_or(kill, kill_of(op(k)));
    return kill;
  }
  if (p == "select_n" && g_.operand_count(n) == 3) {
    std::string ka = kill_of(op(1)), kb = kill_of(op(2));
    if (ka == kb)
      return ka;
    auto pred = op(0);
    std::string pe = pure_predicate(n);
    if (pe.empty())
      return k_and(ka, kb);
    if (pred.is_node())
      kill_refs_.insert(pred.id);
    return k_or(k_and(pe, kb), k_and(k_not(pe), ka));
  }
  if (p == "max")
    return k_and(kill_of(op(0)), kill_of(op(1)));
  return "False";
}

bool attention_codegen::emit_preops(const traced_operand& t, const std::string& name,
                                    bool drop_trailing_casts, std::string& why) {
  std::vector<int> ops = t.preops;
  if (drop_trailing_casts)
    while (!ops.empty() && g_.primitive(ops.back()) == "convert_element_type")
      ops.pop_back();
  std::string f = "def _pre_" + name + "(x, xp):\n";
  for (int n : ops) {
    std::vector<std::string> args;
    bool seen_tensor = false;
    for (unsigned k = 0; k < g_.operand_count(n); ++k) {
      auto o = g_.operand(n, k);
      bool is_const = is_constant_scalar(g_, o) ||
                      constant_scalar_behind(g_, o).what != value_ref::kind::unknown;
      if (!is_const && !seen_tensor) {
        args.push_back("x");
        seen_tensor = true;
      } else {
        auto c = is_constant_scalar(g_, o) ? o : constant_scalar_behind(g_, o);
        std::string dt = operand_dtype(g_, n, k);
        args.push_back(const_expr(c, dt, why));
        if (args.back().empty())
          return false;
      }
    }
    auto e = ew_expr(n, args, why);
    if (e.empty())
      return false;
    f += "    x = " + e + "\n";
  }
  f += "    return x\n";
  functions_ += f + "\n\n";
  return true;
}

bool attention_codegen::build(std::string& why) {
  auto configs = spec_.getConfigurations();
  if (configs.size() == 0) {
    why = "the spec has no configuration";
    return false;
  }
  auto inputs = configs[0].getInputs();
  for (unsigned i = 0; i < inputs.size(); ++i)
    if (!inputs[i].getIsStatic())
      spec_index_.push_back(static_cast<int>(i));
  if (spec_index_.size() != g_.input_count()) {
    why = "the graph's inputs do not match the spec's array inputs";
    return false;
  }
  known_.insert(p_.attention_nodes.begin(), p_.attention_nodes.end());
  for (const auto& t : p_.terms)
    for (const auto* o : {&t.q, &t.k}) {
      known_.insert(o->layout.begin(), o->layout.end());
      known_.insert(o->preops.begin(), o->preops.end());
    }
  known_.insert(p_.v.layout.begin(), p_.v.layout.end());
  known_.insert(p_.v.preops.begin(), p_.v.preops.end());
  if (!build_replays(why))
    return false;
  if (!solve_sizes(why))
    return false;
  collect_feature_sizes();
  for (size_t t = 0; t < p_.terms.size(); ++t)
    term_of_dot_[p_.terms[t].dot] = static_cast<int>(t);
  // inputs of the score function: tiles (they vary along rows or keys) or SMEM scalars
  int n_tiles = 0, n_scalars = 0;
  for (const auto& u : p_.region_inputs) {
    index_list leaves = flatten(u.axes);
    bool has_key = false, has_row = false;
    for (int l : leaves) {
      if (contains(p_.keys, l))
        has_key = true;
      if (contains(p_.q_rows, l))
        has_row = true;
    }
    std::string dt = g_.input_type(static_cast<unsigned>(u.input)).getDtype().cStr();
    if (has_key || has_row) {
      index_list sub;
      std::string var = "t" + std::to_string(n_tiles);
      std::string base = arg(u.input), pre;
      axis_indices axes = u.axes;
      if (has_row) {
        // an input that varies along some query rows only (per-head slopes): broadcast
        // along the others before the kernel, so that its blocks follow the row blocks
        index_list missing;
        for (int l : p_.q_rows)
          if (!contains(leaves, l))
            missing.push_back(l);
        if (!missing.empty()) {
          std::vector<std::string> unit_shape, full_shape;
          axes.clear();
          for (int l : leaves) {
            unit_shape.push_back(size_of(l));
            full_shape.push_back(size_of(l));
            axes.push_back({l});
          }
          for (int l : missing) {
            unit_shape.push_back("1");
            full_shape.push_back(size_of(l));
            axes.push_back({l});
          }
          pre = fmt::format("{0} = jnp.broadcast_to({1}.reshape({2}), {3})\n", var, base,
                            tuple(unit_shape), tuple(full_shape));
          base = var;
        }
        sub = p_.q_rows;
      }
      index_list lane;
      if (has_key) {
        if (p_.keys.size() != 1) {
          why = "a mask or bias over split keys";
          return false;
        }
        lane = p_.keys;
      }
      operand_view view;
      if (!make_view(var, base, axes, sub, "rows", lane, false, false, view, why))
        return false;
      view.code = pre + view.code;
      if (dt == "bool") {
        view.code += fmt::format("{0} = {0}.astype(jnp.int32)\n", var);
        input_use_[{u.node, u.operand}] = "(ix.t(" + std::to_string(n_tiles) + ") != 0)";
      } else {
        input_use_[{u.node, u.operand}] = "ix.t(" + std::to_string(n_tiles) + ")";
      }
      tile_item_ += dt == "bool" ? 4 : attention_dtype_bytes(dt);
      tile_views_.push_back(view);
      ++n_tiles;
    } else {
      if (dt != "int32" && dt != "float32" && dt != "bool" && dt != "uint32") {
        why = "a per-sequence scalar input of dtype " + dt;
        return false;
      }
      // flattened in kv-row order
      std::vector<std::pair<int, int>> cs;  // (c axis, leaf)
      for (int l : leaves)
        cs.push_back({c_axis(l), l});
      std::sort(cs.begin(), cs.end());
      index_list ordered;
      std::vector<int> caxes;
      for (auto [c, l] : cs) {
        ordered.push_back(l);
        caxes.push_back(c);
      }
      std::string var = "sc" + std::to_string(n_scalars);
      operand_view view;
      view.var = var;
      std::string code = var + " = " + arg(u.input) + "\n";
      if (ordered != leaves && leaves.size() > 1) {
        std::vector<std::string> shape, perm;
        for (int l : leaves)
          shape.push_back(size_of(l));
        for (int l : ordered)
          perm.push_back(std::to_string(std::find(leaves.begin(), leaves.end(), l) - leaves.begin()));
        code += fmt::format("{0} = jnp.transpose({0}.reshape({1}), {2})\n", var, tuple(shape),
                            tuple(perm));
      }
      code += fmt::format("{0} = {0}.reshape(-1)\n", var);
      if (dt == "bool")
        code += fmt::format("{0} = {0}.astype(jnp.int32)\n", var);
      view.code = code;
      input_use_[{u.node, u.operand}] =
          dt == "bool" ? "(ix.s(" + std::to_string(n_scalars) + ") != 0)"
                       : "ix.s(" + std::to_string(n_scalars) + ")";
      scalar_views_.push_back(view);
      scalar_c_.push_back(caxes);
      ++n_scalars;
    }
  }
  // Q, K of each term; V; the output
  std::string lane_dtype;
  for (size_t t = 0; t < p_.terms.size(); ++t) {
    const auto& term = p_.terms[t];
    if (base_expr(term.q.base).empty() ||
        (!external_kv_ && (base_expr(term.k.base).empty() || base_expr(p_.v.base).empty()))) {
      why = "an attention operand of unknown origin";
      return false;
    }
    for (int l : p_.q_rows)
      if (!contains(flatten(term.q.axes), l)) {
        why = "a query operand does not vary along every query row";
        return false;
      }
    // the contraction order: as the query lays it out
    index_list lane;
    for (int l : flatten(term.q.axes))
      if (contains(term.contraction, l))
        lane.push_back(l);
    operand_view qv, kv;
    if (!make_view("q" + std::to_string(t), base_expr(term.q.base), term.q.axes, p_.q_rows, "rows",
                   lane, true, false, qv, why))
      return false;
    if (!external_kv_ &&
        !make_view("k" + std::to_string(t), base_expr(term.k.base), term.k.axes, p_.keys, "keys",
                   lane, true, false, kv, why))
      return false;
    q_views_.push_back(qv);
    k_views_.push_back(kv);
    // the dtypes of Q K^T: exact bf16 products when both sides are upcast bf16
    auto storage = [&](const traced_operand& o) {
      std::string d = g_.dtype(o.base);
      std::vector<int> ops = o.preops;
      while (!ops.empty() && g_.primitive(ops.back()) == "convert_element_type")
        ops.pop_back();
      if (!ops.empty())
        d = result_dtype(g_, ops.back());
      return d;
    };
    std::string qd = storage(term.q), kd = storage(term.k);
    std::string ref_dt = operand_dtype(g_, term.dot, 0);
    bool elide = is_16bit_float(qd) && qd == kd && !is_16bit_float(ref_dt) && ref_dt == "float32";
    std::string dot_dt = elide ? qd : ref_dt;
    if (!emit_preops(term.q, "q" + std::to_string(t), elide, why) ||
        !emit_preops(term.k, "k" + std::to_string(t), elide, why))
      return false;
    term_dtypes_.push_back({dot_dt, result_dtype(g_, term.dot)});
    q_item_ = std::max(q_item_, attention_dtype_bytes(g_.dtype(term.q.base)));
    kv_item_ = std::max(kv_item_, attention_dtype_bytes(g_.dtype(term.k.base)));
  }
  {
    std::vector<int> ops = p_.v.preops;
    std::string vd = g_.dtype(p_.v.base);
    while (!ops.empty() && g_.primitive(ops.back()) == "convert_element_type")
      ops.pop_back();
    if (!ops.empty())
      vd = result_dtype(g_, ops.back());
    v_storage_dtype_ = vd;
    index_list lane;
    for (int l : flatten(p_.v.axes))
      if (contains(p_.value_dims, l))
        lane.push_back(l);
    if (!external_kv_ && !make_view("v0", base_expr(p_.v.base), p_.v.axes, p_.keys, "keys", lane,
                                    true, false, v_view_, why))
      return false;
    if (!emit_preops(p_.v, "v", is_16bit_float(vd), why))
      return false;
    // V read as a key operand's tile (MLA's latent cache is keys and values at once): the
    // same input in the same layout (each applies its own pre-operations to the tile)
    for (size_t t = 0; t < p_.terms.size() && !external_kv_ && v_share_ < 0; ++t) {
      const auto& k = p_.terms[t].k;
      if (!k.base.is_input() || !p_.v.base.is_input() || k.base.id != p_.v.base.id ||
          k.axes.size() != p_.v.axes.size())
        continue;
      bool same = true;
      for (size_t a = 0; a < k.axes.size() && same; ++a) {
        const auto &ka = k.axes[a], &va = p_.v.axes[a];
        if (ka == va)
          continue;
        same = ka.size() == va.size();
        for (size_t i = 0; i < ka.size() && same; ++i)
          same = contains(p_.terms[t].contraction, ka[i]) && contains(p_.value_dims, va[i]) &&
                 p_.space.size(ka[i]) == p_.space.size(va[i]);
      }
      if (same)
        v_share_ = static_cast<int>(t);
    }
    kv_item_ = std::max(kv_item_, attention_dtype_bytes(g_.dtype(p_.v.base)));
    // the output keeps V's value-dimension order
    index_list out_leaves = flatten(p_.out_axes);
    index_list expect = p_.kv_rows;
    expect.insert(expect.end(), p_.q_rows.begin(), p_.q_rows.end());
    expect.insert(expect.end(), p_.value_dims.begin(), p_.value_dims.end());
    index_list a = out_leaves, b = expect;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) {
      why = "the output does not hold every row and value index once";
      return false;
    }
    if (!make_view("o", "out", p_.out_axes, p_.q_rows, "rows", lane, true, true, out_view_, why))
      return false;
    out_item_ = attention_dtype_bytes(p_.out_dtype);
  }
  int min_item = std::min(q_item_, out_item_);
  row_align_ = min_item >= 4 ? 8 : (min_item == 2 ? 16 : 32);
  if (!emit_region(why))
    return false;
  return accounted(why);
}

std::string attention_codegen::base_expr(const value_ref& base) const {
  if (base.is_input())
    return arg(base.id);
  if (base.is_node()) {
    auto it = node_base_.find(base.id);
    if (it != node_base_.end())
      return it->second;
  }
  return "";
}

bool attention_codegen::build_replays(std::string& why) {
  std::vector<value_ref> bases;
  auto want = [&](const value_ref& b) {
    if (b.is_node() && std::none_of(bases.begin(), bases.end(),
                                    [&](const value_ref& x) { return x.id == b.id; }))
      bases.push_back(b);
  };
  for (const auto& t : p_.terms) {
    want(t.q.base);
    if (!external_kv_)
      want(t.k.base);
  }
  if (!external_kv_)
    want(p_.v.base);
  if (bases.empty() && p_.epilogue_from < 0)
    return true;
  std::vector<std::string> inputs;
  for (unsigned k = 0; k < g_.input_count(); ++k)
    inputs.push_back(arg(static_cast<int>(k)));
  moe::dim_symbols dims(g_, inputs);
  {
    std::vector<std::vector<std::string>> names(g_.input_count());
    auto spec_inputs = spec_.getConfigurations()[0].getInputs();
    for (unsigned k = 0; k < g_.input_count(); ++k)
      for (auto n : spec_inputs[static_cast<unsigned>(spec_index_[k])].getDimNames())
        names[k].push_back(n.cStr());
    dims.set_size_names(names, spec_.getFormat() != schema::SpecFormat::NATIVE);
  }
  auto overlaps_attention = [&](const std::vector<int>& nodes) {
    for (int n : nodes)
      if (std::binary_search(p_.attention_nodes.begin(), p_.attention_nodes.end(), n))
        return true;
    return false;
  };
  if (!bases.empty()) {
    moe::replay_request req;
    req.outputs = bases;
    req.inputs = inputs;
    req.prefix = "r";
    moe::replay_code code;
    std::string reason;
    if (!moe::build_replay(g_, dims, req, code, reason)) {
      why = "cannot compute the attention's operands before the kernel: " + reason;
      return false;
    }
    if (overlaps_attention(code.nodes)) {
      why = "an attention operand depends on the attention itself";
      return false;
    }
    for (size_t i = 0; i < bases.size(); ++i)
      node_base_[bases[i].id] = code.outputs[i];
    prologue_code_ = code.code(0);
    known_.insert(code.nodes.begin(), code.nodes.end());
  }
  if (p_.epilogue_from >= 0) {
    moe::replay_request req;
    req.outputs = {g_.output(0)};
    req.given[p_.out_value.id] = "out";
    req.inputs = inputs;
    req.prefix = "e";
    moe::replay_code code;
    std::string reason;
    if (!moe::build_replay(g_, dims, req, code, reason)) {
      why = "cannot compute the output after the kernel: " + reason;
      return false;
    }
    if (overlaps_attention(code.nodes)) {
      why = "the output reads attention internals (probabilities, scores)";
      return false;
    }
    epilogue_code_ = code.code(0);
    result_ = code.outputs[0];
    known_.insert(code.nodes.begin(), code.nodes.end());
  }
  module_code_ = moe::replay_prelude() + "\n\n";
  return true;
}

bool attention_codegen::accounted(std::string& why) const {
  std::vector<int> stack;
  std::set<int> seen;
  if (g_.output(0).is_node())
    stack.push_back(g_.output(0).id);
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second)
      continue;
    value_ref v{value_ref::kind::node, n, ""};
    if (!known_.count(n) && !is_constant_scalar(g_, v) &&
        constant_scalar_behind(g_, v).what == value_ref::kind::unknown) {
      why = "the reference computes more than the attention (" + g_.primitive(n) + ")";
      return false;
    }
    for (unsigned k = 0; k < g_.operand_count(n); ++k)
      if (g_.operand(n, k).is_node())
        stack.push_back(g_.operand(n, k).id);
  }
  return true;
}

std::string attention_codegen::summary() const {
  std::vector<std::string> kv, qr, dims;
  for (int l : p_.kv_rows)
    kv.push_back(std::to_string(p_.space.size(l)));
  for (int l : p_.q_rows)
    qr.push_back(std::to_string(p_.space.size(l)));
  for (auto d : qk_dims())
    dims.push_back(std::to_string(d));
  std::string mask = !has_kill_ ? "none" : (kill_static_ ? "static" : "data-dependent");
  bool transposed = out_view_.transposed || v_view_.transposed;
  for (const auto& v : q_views_)
    transposed = transposed || v.transposed;
  for (const auto& v : k_views_)
    transposed = transposed || v.transposed;
  return fmt::format(
      "softmax attention: kv rows [{}] x query rows [{}] over {} keys, qk dims [{}], v dim {}, "
      "{} score op(s), mask {}, {} input(s) in the scores, {}{}",
      join(kv, ","), join(qr, ","), keys_extent(), join(dims, "+"), value_extent(), score_ops_,
      mask, p_.region_inputs.size(), transposed ? "transposed layout" : "layout read in place",
      p_.deferred_norm ? ", normalised after PV" : "");
}

std::optional<tunable> heads_tunable(const nlohmann::json& facts) {
  int head = facts.value("head_axis", -1);
  if (head < 0)
    return std::nullopt;
  tunable bh;
  bh.name = "block_h";
  bh.what = tunable::kind::block;
  bh.extent = facts["kv_rows"][static_cast<size_t>(head)];
  bh.align = 1;
  bh.grid_axis = head;
  bh.meaning = "heads per block (batched dots): fewer, larger grid steps";
  return bh;
}

int64_t heads_per_block(const nlohmann::json& facts, const nlohmann::json& params) {
  int head = facts.value("head_axis", -1);
  if (head < 0)
    return 1;
  return effective_block(facts["kv_rows"][static_cast<size_t>(head)].get<int64_t>(), 1,
                         params.value("block_h", 1));
}

int attention_codegen::head_axis() const {
  // q and the output hold the axis; a key or value view may instead be shared by the heads
  // (an MLA rope key): the kernel folds the heads into the rows of that product. Paged keys
  // and values (external) are the paged template's to check.
  std::vector<const operand_view*> own, kv;
  for (const auto& v : q_views_)
    own.push_back(&v);
  own.push_back(&out_view_);
  if (!external_kv_) {
    for (const auto& v : k_views_)
      kv.push_back(&v);
    if (v_share_ < 0)
      kv.push_back(&v_view_);
  }
  for (int c = static_cast<int>(p_.kv_rows.size()) - 1; c >= 0; --c) {
    if (p_.space.size(p_.kv_rows[static_cast<size_t>(c)]) < 2 || contains(kill_c_, c))
      continue;
    bool ok = std::all_of(own.begin(), own.end(),
                          [&](const operand_view* v) { return contains(v->lead_c, c); });
    for (const auto* v : kv)
      ok = ok && !contains(v->lane_c, c);
    for (const auto& t : tile_views_)
      ok = ok && !contains(t.lane_c, c);
    for (const auto& sc : scalar_c_)
      ok = ok && !contains(sc, c);
    ok = ok && functions_.find(fmt::format("ix.c({})", c)) == std::string::npos;
    if (ok)
      return c;
  }
  return -1;
}

nlohmann::json attention_codegen::facts() const {
  nlohmann::json f;
  f["rows"] = rows_extent();
  f["keys"] = keys_extent();
  f["qk_dims"] = qk_dims();
  f["value_dim"] = value_extent();
  f["kv_rows"] = nlohmann::json::array();
  for (int l : p_.kv_rows)
    f["kv_rows"].push_back(p_.space.size(l));
  f["q_rows"] = nlohmann::json::array();
  for (int l : p_.q_rows)
    f["q_rows"].push_back(p_.space.size(l));
  f["itemsize_q"] = q_item_;
  f["itemsize_kv"] = kv_item_;
  f["itemsize_out"] = out_item_;
  f["tile_bytes"] = tile_item_;
  f["row_align"] = row_align_;
  f["mask"] = !has_kill_ ? "none" : (kill_static_ ? "static" : "dynamic");
  f["v_storage_dtype"] = v_storage_dtype_;
  f["v_shared"] = v_share_ >= 0;
  f["head_axis"] = head_axis();
  f["out_dtype"] = p_.out_dtype;
  return f;
}

}  // namespace maxkernel::agents::expert
