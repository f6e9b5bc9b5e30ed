#include "agents/expert/index_replay.hpp"

#include "agents/expert/index_evaluator.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/softmax_attention_match.hpp"

#include <fmt/format.h>

#include <cmath>
#include <set>

namespace maxkernel::agents::expert::graph_facts {

namespace {

const std::map<std::string, std::string>& unary() {
  static const std::map<std::string, std::string> u = {
      {"neg", "jnp.negative"}, {"exp", "jnp.exp"}, {"exp2", "jnp.exp2"}, {"log", "jnp.log"},
      {"log1p", "jnp.log1p"}, {"expm1", "jnp.expm1"}, {"sqrt", "jnp.sqrt"},
      {"rsqrt", "jax.lax.rsqrt"}, {"abs", "jnp.abs"}, {"sign", "jnp.sign"},
      {"floor", "jnp.floor"}, {"ceil", "jnp.ceil"}, {"round", "jnp.round"},
      {"tanh", "jnp.tanh"}, {"logistic", "jax.nn.sigmoid"}, {"square", "jnp.square"},
      {"sin", "jnp.sin"}, {"cos", "jnp.cos"}, {"stop_gradient", ""}, {"copy", ""},
      {"copy_p", ""}, {"optimization_barrier", ""}, {"reduce_precision", ""}};
  return u;
}

const std::map<std::string, std::string>& binary() {
  static const std::map<std::string, std::string> b = {
      {"add", "jnp.add"}, {"add_any", "jnp.add"}, {"sub", "jnp.subtract"},
      {"mul", "jnp.multiply"}, {"max", "jnp.maximum"}, {"min", "jnp.minimum"},
      {"pow", "jnp.power"}, {"rem", "jnp.remainder"}, {"ge", "jnp.greater_equal"},
      {"gt", "jnp.greater"}, {"le", "jnp.less_equal"}, {"lt", "jnp.less"}, {"eq", "jnp.equal"},
      {"ne", "jnp.not_equal"}, {"atan2", "jnp.arctan2"}};
  return b;
}

std::string literal_expr(const std::string& json_text) {
  auto j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_boolean())
    return j.get<bool>() ? "True" : "False";
  if (j.is_string()) {
    auto s = j.get<std::string>();
    return s == "nan" ? "float(\"nan\")" : s == "-inf" ? "float(\"-inf\")" : "float(\"inf\")";
  }
  if (j.is_number_integer())
    return std::to_string(j.get<int64_t>());
  if (j.is_number())
    return fmt::format("{:.17g}", j.get<double>());
  return "";
}

}  // namespace

bool replay_index_only(const graph_view& g, const std::vector<int>& outputs,
                       const std::map<int64_t, std::string>& sizes, std::string& code,
                       std::string& why) {
  index_evaluator ev(g);
  for (int id : outputs)
    if (!ev.index_only(value_ref{value_ref::kind::node, id, ""})) {
      why = fmt::format("node {} ({}) is not index-only", id, g.primitive(id));
      return false;
    }
  return replay_values(g, outputs, sizes, replay_sources{}, code, why);
}

namespace {

// Which result of node `id` an operand of type `t` is (matched by dtype and shape).
int result_of(const graph_view& g, int id, schema::TensorType::Reader t) {
  auto rs = g.node(id).getResults();
  int found = -1;
  for (unsigned r = 0; r < rs.size(); ++r)
    if (std::string(rs[r].getDtype().cStr()) == t.getDtype().cStr() &&
        to_vector(rs[r].getShape()) == to_vector(t.getShape())) {
      if (found >= 0)
        return -2;  // ambiguous
      found = static_cast<int>(r);
    }
  return found;
}

}  // namespace

std::string replayed(const graph_view& g, const value_ref& v, const replay_sources& src,
                     int node_result) {
  if (v.is_literal())
    return literal_expr(v.literal);
  if (v.is_input()) {
    auto it = src.inputs.find(v.id);
    return it == src.inputs.end() ? "" : it->second;
  }
  if (!v.is_node())
    return "";
  if (g.node(v.id).getResults().size() > 1 || node_result >= 0) {
    auto it = src.results.find({v.id, std::max(node_result, 0)});
    return it == src.results.end() ? "" : it->second;
  }
  auto it = src.results.find({v.id, 0});
  return it != src.results.end() ? it->second : "t" + std::to_string(v.id);
}

bool replay_values(const graph_view& g, const std::vector<int>& outputs,
                   const std::map<int64_t, std::string>& sizes, const replay_sources& src,
                   std::string& code, std::string& why) {
  std::set<int> need;
  std::set<int> given_nodes;
  for (const auto& [key, _] : src.results)
    given_nodes.insert(key.first);
  std::vector<int> stack(outputs.begin(), outputs.end());
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (given_nodes.count(id) || !need.insert(id).second)
      continue;
    for (unsigned k = 0; k < g.operand_count(id); ++k)
      if (g.operand(id, k).is_node())
        stack.push_back(g.operand(id, k).id);
  }
  auto size = [&](int64_t s) {
    auto it = sizes.find(s);
    return s != 1 && it != sizes.end() ? it->second : std::to_string(s);
  };
  auto shape_of = [&](const std::vector<int64_t>& shape) {
    std::string t = "(";
    for (auto s : shape)
      t += size(s) + ", ";
    return t + ")";
  };
  auto arg = [&](int id, unsigned k) -> std::string {
    auto o = g.operand(id, k);
    int r = -1;
    if (o.is_node() && g.node(o.id).getResults().size() > 1)
      r = o.result >= 0 ? o.result : result_of(g, o.id, g.node(id).getOperands()[k]);
    if (r == -2)
      return "";
    return replayed(g, o, src, r);
  };
  code.clear();
  for (int id : need) {
    auto p = g.primitive(id);
    const auto& params = g.params(id);
    auto rshape = to_vector(g.node(id).getResults()[0].getShape());
    std::string dtype = g.node(id).getResults()[0].getDtype().cStr();
    std::string e;
    for (unsigned k = 0; k < g.operand_count(id); ++k)
      if (arg(id, k).empty()) {
        why = fmt::format("node {} ({}): operand {} has no expression", id, p, k);
        return false;
      }
    if (p == "iota") {
      e = fmt::format("jax.lax.broadcasted_iota(jnp.{}, {}, {})", dtype, shape_of(rshape),
                      params.value("dimension", 0));
    } else if (p == "broadcast_in_dim") {
      // broadcast dims are positions, never sizes: write them literally
      auto bd = params.value("broadcast_dimensions", std::vector<int64_t>{});
      std::string t = "(";
      for (auto d : bd)
        t += std::to_string(d) + ", ";
      e = fmt::format("jax.lax.broadcast_in_dim(jnp.asarray({}), {}, {})", arg(id, 0),
                      shape_of(rshape), t + ")");
    } else if (p == "reshape" || p == "squeeze" || p == "expand_dims") {
      e = fmt::format("jnp.reshape({}, {})", arg(id, 0), shape_of(rshape));
    } else if (p == "convert_element_type") {
      e = fmt::format("jnp.asarray({}).astype(jnp.{})", arg(id, 0), dtype);
    } else if (p == "transpose") {
      auto perm = params.value("permutation", std::vector<int>{});
      std::string t = "(";
      for (int d : perm)
        t += std::to_string(d) + ", ";
      e = fmt::format("jnp.transpose({}, {})", arg(id, 0), t + ")");
    } else if (p == "select_n" && g.operand_count(id) == 3) {
      e = fmt::format("jnp.where(jnp.asarray({}).astype(bool), {}, {})", arg(id, 0), arg(id, 2),
                      arg(id, 1));
    } else if (p == "integer_pow") {
      e = fmt::format("jax.lax.integer_pow(jnp.asarray({}), {})", arg(id, 0), params.value("y", 1));
    } else if (p == "div") {
      e = dtype.find("int") != std::string::npos
              ? fmt::format("jax.lax.div(jnp.asarray({}), jnp.asarray({}, jnp.{}))", arg(id, 0), arg(id, 1), dtype)
              : fmt::format("jnp.divide({}, {})", arg(id, 0), arg(id, 1));
    } else if (p == "not") {
      e = (dtype == "bool" ? "jnp.logical_not(" : "jnp.invert(") + arg(id, 0) + ")";
    } else if (p == "and" || p == "or" || p == "xor") {
      e = fmt::format("jnp.{}_{}({}, {})", dtype == "bool" ? "logical" : "bitwise", p, arg(id, 0),
                      arg(id, 1));
    } else if (p == "clamp") {
      e = fmt::format("jnp.clip({}, {}, {})", arg(id, 1), arg(id, 0), arg(id, 2));
    } else if (p == "reduce_sum" || p == "reduce_max" || p == "reduce_min" || p == "reduce_prod") {
      auto axes = params.value("axes", std::vector<int>{});
      std::string t = "(";
      for (int a : axes)
        t += std::to_string(a) + ", ";
      e = fmt::format("jnp.{}({}, axis={})", p.substr(7), arg(id, 0), t + ")");
    } else if (p == "cumsum") {
      int axis = params.value("axis", 0);
      e = params.value("reverse", false)
              ? fmt::format("jnp.flip(jnp.cumsum(jnp.flip({0}, {1}), axis={1}), {1})", arg(id, 0), axis)
              : fmt::format("jnp.cumsum({}, axis={})", arg(id, 0), axis);
    } else if (p == "dot_general") {
      auto tuple_of = [](const std::vector<int>& v) {
        std::string t = "(";
        for (int x : v)
          t += std::to_string(x) + ", ";
        return t + ")";
      };
      auto lc = params.value("lhs_contracting", std::vector<int>{});
      auto rc = params.value("rhs_contracting", std::vector<int>{});
      auto lb = params.value("lhs_batch", std::vector<int>{});
      auto rb = params.value("rhs_batch", std::vector<int>{});
      std::string pref = params.contains("preferred_element_type") &&
                                 params["preferred_element_type"].is_string()
                             ? ", preferred_element_type=jnp." +
                                   params["preferred_element_type"].get<std::string>()
                             : "";
      e = fmt::format("jax.lax.dot_general({}, {}, (({}, {}), ({}, {})){})", arg(id, 0), arg(id, 1),
                      tuple_of(lc), tuple_of(rc), tuple_of(lb), tuple_of(rb), pref);
    } else if (p == "slice") {
      auto start = params.value("start_indices", std::vector<int64_t>{});
      auto limit = params.value("limit_indices", std::vector<int64_t>{});
      auto st = params.contains("strides") && params["strides"].is_array()
                    ? params["strides"].get<std::vector<int64_t>>() : std::vector<int64_t>(start.size(), 1);
      std::string a = "(", b = "(", c = "(";
      for (size_t i = 0; i < start.size(); ++i) {
        a += std::to_string(start[i]) + ", ";
        // a slice to the end follows the dim's size; other limits stay literal
        auto ishape = g.shape(g.operand(id, 0));
        b += (i < ishape.size() && limit[i] == ishape[i] ? size(limit[i]) : std::to_string(limit[i])) + ", ";
        c += std::to_string(i < st.size() ? st[i] : 1) + ", ";
      }
      e = fmt::format("jax.lax.slice({}, {}, {}, {})", arg(id, 0), a + ")", b + ")", c + ")");
    } else if (p == "concatenate") {
      std::string parts;
      for (unsigned k = 0; k < g.operand_count(id); ++k)
        parts += arg(id, k) + ", ";
      e = fmt::format("jnp.concatenate([{}], axis={})", parts, params.value("dimension", 0));
    } else if (p == "rev") {
      auto dims = params.value("dimensions", std::vector<int64_t>{});
      std::string t = "(";
      for (auto d : dims)
        t += std::to_string(d) + ", ";
      e = fmt::format("jax.lax.rev({}, {})", arg(id, 0), t + ")");
    } else if (p == "argmax" || p == "argmin") {
      auto axes = params.value("axes", std::vector<int>{});
      if (axes.size() != 1) {
        why = fmt::format("node {}: {} over several axes", id, p);
        return false;
      }
      e = fmt::format("jnp.{}({}, axis={})", p, arg(id, 0), axes[0]);
    } else if (p == "gather" && params.contains("dimension_numbers")) {
      const auto& dn = params["dimension_numbers"];
      auto tuple_of = [](const nlohmann::json& a) {
        std::string t = "(";
        for (const auto& x : a)
          t += std::to_string(x.get<int64_t>()) + ", ";
        return t + ")";
      };
      std::string dims = "jax.lax.GatherDimensionNumbers(offset_dims=" + tuple_of(dn.value("offset_dims", nlohmann::json::array())) +
                         ", collapsed_slice_dims=" + tuple_of(dn.value("collapsed_slice_dims", nlohmann::json::array())) +
                         ", start_index_map=" + tuple_of(dn.value("start_index_map", nlohmann::json::array())) +
                         ", operand_batching_dims=" + tuple_of(dn.value("operand_batching_dims", nlohmann::json::array())) +
                         ", start_indices_batching_dims=" + tuple_of(dn.value("start_indices_batching_dims", nlohmann::json::array())) + ")";
      auto slice_sizes = params.value("slice_sizes", std::vector<int64_t>{});
      std::string mode = params.value("mode", std::string("FILL_OR_DROP"));
      std::string fill = params.contains("fill_value") && !params["fill_value"].is_null()
                             ? ", fill_value=" + literal_expr(params["fill_value"].dump()) : "";
      e = fmt::format("jax.lax.gather({}, {}, {}, {}, mode=jax.lax.GatherScatterMode.{}{})",
                      arg(id, 0), arg(id, 1), dims, shape_of(slice_sizes), mode, fill);
    } else if (unary().count(p)) {
      auto f = unary().at(p);
      e = f.empty() ? arg(id, 0) : fmt::format("{}({})", f, arg(id, 0));
    } else if (binary().count(p)) {
      e = fmt::format("{}({}, {})", binary().at(p), arg(id, 0), arg(id, 1));
    } else {
      why = fmt::format("node {}: cannot replay {}", id, p);
      return false;
    }
    // keep the reference's dtype (weakly typed literals would otherwise widen)
    if (p != "iota" && p != "convert_element_type")
      e = fmt::format("jnp.asarray({}).astype(jnp.{})", e, dtype);
    code += fmt::format("t{} = {}\n", id, e);
  }
  return true;
}

std::vector<int> place_forward(const graph_view& g, int from,
                               const std::vector<int64_t>& target_shape, int anchor) {
  static const std::set<std::string> elementwise = {
      "add", "add_any", "sub", "mul", "div", "max", "min", "pow", "rem", "neg", "exp", "log",
      "log1p", "expm1", "sqrt", "rsqrt", "abs", "sign", "tanh", "logistic", "square",
      "integer_pow", "select_n", "convert_element_type", "copy", "stop_gradient", "clamp",
      "ge", "gt", "le", "lt", "eq", "ne", "and", "or", "not", "exp2", "floor", "ceil", "round"};
  struct item {
    int node;
    std::vector<int> map;  // dims of `from` -> dims of node
    int depth;
  };
  auto fshape = to_vector(g.node(from).getResults()[0].getShape());
  std::vector<int> ident(fshape.size());
  for (size_t i = 0; i < ident.size(); ++i)
    ident[i] = fshape[i] == 1 ? -1 : static_cast<int>(i);
  std::vector<item> stack = {{from, ident, 0}};
  value_ref anchor_ref{value_ref::kind::node, anchor, ""};
  while (!stack.empty()) {
    auto it = stack.back();
    stack.pop_back();
    if (it.depth > 24)
      continue;
    auto ishape = to_vector(g.node(it.node).getResults()[0].getShape());
    for (int c : g.consumers(it.node)) {
      auto p = g.primitive(c);
      auto cshape = to_vector(g.node(c).getResults()[0].getShape());
      std::vector<int> next(it.map.size(), -1);
      bool ok = true;
      if (p == "broadcast_in_dim") {
        auto bd = g.params(c).value("broadcast_dimensions", std::vector<int>{});
        for (size_t i = 0; i < it.map.size(); ++i)
          if (it.map[i] >= 0) {
            auto o = static_cast<size_t>(bd[static_cast<size_t>(it.map[i])]);
            next[i] = cshape[o] == ishape[static_cast<size_t>(it.map[i])] ? static_cast<int>(o) : -1;
          }
      } else if (p == "transpose") {
        auto perm = g.params(c).value("permutation", std::vector<int>{});
        for (size_t i = 0; i < it.map.size(); ++i)
          for (size_t j = 0; j < perm.size(); ++j)
            if (it.map[i] >= 0 && perm[j] == it.map[i])
              next[i] = static_cast<int>(j);
      } else if (p == "reshape" || p == "squeeze" || p == "expand_dims") {
        std::vector<size_t> ib, ob;
        for (size_t i = 0; i < ishape.size(); ++i)
          if (ishape[i] != 1)
            ib.push_back(i);
        for (size_t i = 0; i < cshape.size(); ++i)
          if (cshape[i] != 1)
            ob.push_back(i);
        ok = ib.size() == ob.size();
        for (size_t k = 0; ok && k < ib.size(); ++k) {
          ok = ishape[ib[k]] == cshape[ob[k]];
          for (size_t i = 0; ok && i < it.map.size(); ++i)
            if (it.map[i] == static_cast<int>(ib[k]))
              next[i] = static_cast<int>(ob[k]);
        }
      } else if (elementwise.count(p) && cshape.size() == ishape.size()) {
        for (size_t i = 0; i < it.map.size(); ++i)
          next[i] = it.map[i];
      } else {
        ok = false;
      }
      if (!ok)
        continue;
      if (cshape == target_shape &&
          (c == anchor || depends_on(g, value_ref{value_ref::kind::node, c, ""}, anchor)))
        return next;
      stack.push_back({c, next, it.depth + 1});
    }
  }
  (void)anchor_ref;
  return {};
}

}  // namespace maxkernel::agents::expert::graph_facts
