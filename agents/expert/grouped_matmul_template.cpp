// Template grouped_matmul: the grouped (ragged) matmul of mixture-of-experts layers, where
// row r of x is multiplied by the weights of its expert. Recognised spellings (on the graph,
// whatever the source looked like):
//  - ragged_dot / ragged_dot_general: x [M, K], w [G, K, N] (or [G, N, K]), group sizes [G]
//    (rows sorted by group);
//  - gathered weights: dot_general of x [M, K] with W[ids] (a gather of W's expert axis by a
//    per-row id, or a one-hot of ids contracted with W), batched over the rows;
//  - one-hot combine: the dense product of x with every expert, x @ W -> [M, G, N],
//    contracted (or multiplied and summed) with one_hot(ids) over G;
//  - a segment loop unrolled in Python: sum over g of where(mask_g, x @ W[g], 0), the masks
//    computed from the group sizes alone (a lax.fori_loop is not recognised: its body is a
//    loop in the summary and cannot be replayed).
// Per-row ids are sorted in the module (argsort, XLA) and the rows put back after the kernel;
// ids computed in a loop from group sizes alone are read as the sorted layout. Everything
// else the reference does (computing ids, casts, light routing work) is replayed from the
// graph as XLA ops; the elementwise chain right after a product is fused as the kernel's
// epilogue. Refused: a product with batch dims, references whose other work is heavy
// (over 10% of the flops) or cannot be replayed, ragged contracting/batch dimensions.
#include "agents/expert/block_size.hpp"
#include "agents/expert/fused_epilogue.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/moe_patterns.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_args.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace maxkernel::agents::expert {

namespace {

using namespace moe;

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

value_ref node_ref(int id) { return value_ref{value_ref::kind::node, id, ""}; }

struct grouped_op {
  std::string kind;
  int out_node = -1;          // the product [M, N]
  std::vector<int> chain;     // out_node, then its fused elementwise epilogue
  value_ref lhs, rhs, groups; // groups: sizes [G] (rows sorted) or per-row ids [M]
  bool by_ids = false;
  bool transposed = false;    // rhs [G, N, K]
  int rhs_n_axis = 2;
  int64_t m = 0, k = 0, n = 0, g = 0;
  std::string note;
  int partner = -1;           // another product of the same rows and groups, fused with this one
  int join = -1;              // the node where the two meet (a glu): the epilogue's start
  bool absorbed = false;      // computed by its partner's kernel
};

// ragged_dot_general in jax.lax.ragged_dot's form (ragged rows, contracting the last lhs dim).
std::optional<grouped_op> match_ragged(const graph_view& g, int id) {
  if (g.primitive(id) != "ragged_dot_general" || g.operand_count(id) < 3)
    return std::nullopt;
  grouped_op op;
  op.kind = "ragged_dot";
  op.out_node = id;
  op.lhs = skip_widening(g, g.operand(id, 0));
  op.rhs = skip_widening(g, g.operand(id, 1));
  op.groups = g.operand(id, 2);
  auto ls = g.shape(g.operand(id, 0)), rs = g.shape(g.operand(id, 1)), gs = g.shape(op.groups);
  auto os = g.shape(node_ref(id));
  if (ls.size() != 2 || rs.size() != 3 || gs.size() != 1 || os.size() != 2 || gs[0] != rs[0])
    return std::nullopt;
  // Dimension numbers other than ragged_dot's default are not in the summary's params; the
  // shapes decide (rhs [G, K, N] first, as jax.lax.ragged_dot has it).
  if (g.params(id).contains("ragged_dot_dimension_numbers"))
    return std::nullopt;
  op.m = ls[0];
  op.k = ls[1];
  op.g = rs[0];
  if (rs[1] == op.k && rs[2] == os[1]) {
    op.n = rs[2];
  } else if (rs[2] == op.k && rs[1] == os[1]) {
    op.n = rs[1];
    op.transposed = true;
    op.rhs_n_axis = 1;
  } else {
    return std::nullopt;
  }
  if (os[0] != op.m)
    return std::nullopt;
  return op;
}

// dot_general(x [M, K], W[ids] [M, K, N]) batched over the rows (either operand order).
std::optional<grouped_op> match_gathered(const graph_view& g, int id) {
  if (g.primitive(id) != "dot_general")
    return std::nullopt;
  const auto& p = g.params(id);
  auto lb = ints(p, "lhs_batch"), rb = ints(p, "rhs_batch");
  auto lc = ints(p, "lhs_contracting"), rc = ints(p, "rhs_contracting");
  if (lb.size() != 1 || rb.size() != 1 || lc.size() != 1 || rc.size() != 1)
    return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    auto sel = match_selected_weights(g, g.operand(id, 1 - side));
    if (!sel)
      continue;
    auto xv = g.operand(id, side);
    auto xs = g.shape(xv);
    const auto& xb = side == 0 ? lb : rb;
    const auto& xc = side == 0 ? lc : rc;
    const auto& sb = side == 0 ? rb : lb;
    const auto& sc = side == 0 ? rc : lc;
    if (xs.size() != 2 || xb[0] != 0 || xc[0] != 1 || sb[0] != sel->row_axis)
      continue;
    grouped_op op;
    op.kind = "gathered expert weights";
    op.out_node = id;
    op.lhs = skip_widening(g, xv);
    op.rhs = sel->weights;
    op.groups = sel->ids;
    op.by_ids = true;
    auto ws = g.shape(sel->weights);
    op.m = xs[0];
    op.k = xs[1];
    op.g = ws[0];
    // which of W's dims (1 or 2) is contracted
    int w_k = sc[0] == sel->axes[0] ? 1 : sc[0] == sel->axes[1] ? 2 : 0;
    if (w_k == 0 || ws[w_k] != op.k)
      continue;
    op.transposed = w_k == 2;
    op.rhs_n_axis = w_k == 2 ? 1 : 2;
    op.n = ws[op.rhs_n_axis];
    if (g.shape(node_ref(id)) != std::vector<int64_t>{op.m, op.n})
      continue;
    return op;
  }
  return std::nullopt;
}

// The dense all-experts product Y = x [M, K] . W [G, K, N] -> Y [M, G, N] (no batch dims):
// which axes of Y hold M, G and N.
struct dense_all {
  value_ref x, w;
  int m_axis = -1, g_axis = -1, n_axis = -1;
  bool transposed = false;
  int64_t m = 0, k = 0, n = 0, g = 0;
};

std::optional<dense_all> match_dense_all(const graph_view& g, value_ref y) {
  if (!y.is_node() || g.primitive(y.id) != "dot_general")
    return std::nullopt;
  const auto& p = g.params(y.id);
  if (!ints(p, "lhs_batch").empty() || ints(p, "lhs_contracting").size() != 1)
    return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    auto xv = g.operand(y.id, side), wv = g.operand(y.id, 1 - side);
    auto xs = g.shape(xv), ws = g.shape(wv);
    auto xc = ints(p, side == 0 ? "lhs_contracting" : "rhs_contracting")[0];
    auto wc = ints(p, side == 0 ? "rhs_contracting" : "lhs_contracting")[0];
    if (xs.size() != 2 || ws.size() != 3 || xc != 1 || wc == 0)
      continue;
    dense_all d;
    d.x = skip_widening(g, xv);
    d.w = skip_widening(g, wv);
    d.m = xs[0];
    d.k = xs[1];
    d.g = ws[0];
    d.transposed = wc == 2;
    d.n = ws[wc == 2 ? 1 : 2];
    // result: lhs free dims then rhs free dims
    if (side == 0) {
      d.m_axis = 0;
      d.g_axis = 1;
      d.n_axis = 2;
    } else {
      d.g_axis = 0;
      d.n_axis = 1;
      d.m_axis = 2;
    }
    return d;
  }
  return std::nullopt;
}

// sum over G of Y[m, g, n] * one_hot(ids)[m, g]: a dot_general batched over M contracting G,
// or reduce_sum over G of a product with the broadcast one-hot.
std::optional<grouped_op> match_onehot_combine(const graph_view& g, int id) {
  auto p = g.primitive(id);
  grouped_op op;
  op.kind = "one-hot combine of all experts";
  op.out_node = id;
  op.by_ids = true;
  auto finish = [&](const dense_all& d, const one_hot& oh) -> std::optional<grouped_op> {
    op.lhs = d.x;
    op.rhs = d.w;
    op.groups = oh.ids;
    op.m = d.m;
    op.k = d.k;
    op.n = d.n;
    op.g = d.g;
    op.transposed = d.transposed;
    op.rhs_n_axis = d.transposed ? 1 : 2;
    if (oh.classes != d.g || g.shape(oh.ids) != std::vector<int64_t>{d.m} ||
        g.shape(node_ref(id)) != std::vector<int64_t>{d.m, d.n})
      return std::nullopt;
    return op;
  };
  if (p == "dot_general") {
    const auto& pr = g.params(id);
    auto lb = ints(pr, "lhs_batch"), rb = ints(pr, "rhs_batch");
    auto lc = ints(pr, "lhs_contracting"), rc = ints(pr, "rhs_contracting");
    if (lb.size() != 1 || lc.size() != 1)
      return std::nullopt;
    for (int side = 0; side < 2; ++side) {
      auto d = match_dense_all(g, skip_widening(g, g.operand(id, side)));
      auto oh = match_one_hot(g, skip_widening(g, g.operand(id, 1 - side)));
      if (!d || !oh)
        continue;
      const auto& yb = side == 0 ? lb : rb;
      const auto& yc = side == 0 ? lc : rc;
      const auto& ob = side == 0 ? rb : lb;
      const auto& oc = side == 0 ? rc : lc;
      int oh_m_axis = 1 - oh->class_axis;
      if (g.shape(skip_widening(g, g.operand(id, 1 - side))).size() != 2 || yb[0] != d->m_axis ||
          yc[0] != d->g_axis || oc[0] != oh->class_axis || ob[0] != oh_m_axis)
        continue;
      return finish(*d, *oh);
    }
    return std::nullopt;
  }
  if (p == "reduce_sum") {
    auto axes = ints(g.params(id), "axes");
    auto prod = g.operand(id, 0);
    if (axes.size() != 1 || !prod.is_node() || g.primitive(prod.id) != "mul")
      return std::nullopt;
    for (int side = 0; side < 2; ++side) {
      auto d = match_dense_all(g, skip_widening(g, g.operand(prod.id, side)));
      // the one-hot, broadcast along N: [M, G] -> [M, G, N] (maybe via [M, G, 1])
      auto ohv = g.operand(prod.id, 1 - side);
      std::vector<int64_t> bdims;
      while (ohv.is_node() && g.primitive(ohv.id) == "broadcast_in_dim") {
        auto bd = ints(g.params(ohv.id), "broadcast_dimensions");
        if (!bdims.empty())  // compose: the inner broadcast's dims map through the outer one
          for (auto& b : bd)
            b = b < static_cast<int64_t>(bdims.size()) ? bdims[b] : -1;
        bdims = bd;
        ohv = g.operand(ohv.id, 0);
      }
      auto oh = match_one_hot(g, skip_widening(g, ohv));
      if (!d || !oh || bdims.size() != 2 || g.shape(skip_widening(g, ohv)).size() != 2)
        continue;
      int oh_m_axis = 1 - oh->class_axis;
      if (axes[0] != d->g_axis || bdims[oh->class_axis] != d->g_axis ||
          bdims[oh_m_axis] != d->m_axis)
        continue;
      return finish(*d, *oh);
    }
  }
  return std::nullopt;
}

// A segment loop unrolled in Python: out = sum over g of where(mask_g, x @ W[g], 0) (or
// mask_g * (x @ W[g])), every expert g once, the masks computed from one integer vector of G
// sizes and nothing else: read as the sorted layout, rows [offset_g, offset_g + sizes[g]).
std::optional<grouped_op> match_segment_loop(const graph_view& g, int id) {
  if (g.primitive(id) != "add" && g.primitive(id) != "add_any")
    return std::nullopt;
  for (int c : g.consumers(id))
    if (g.primitive(c) == "add" || g.primitive(c) == "add_any")
      return std::nullopt;  // not the top of the sum
  // the sum's terms
  std::vector<value_ref> terms;
  std::vector<int> stack{id};
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    for (unsigned k = 0; k < 2; ++k) {
      auto v = g.operand(n, k);
      if (v.is_node() && (g.primitive(v.id) == "add" || g.primitive(v.id) == "add_any") &&
          g.consumers(v.id).size() == 1)
        stack.push_back(v.id);
      else
        terms.push_back(v);
    }
  }
  auto out_shape = g.shape(node_ref(id));
  if (out_shape.size() != 2)
    return std::nullopt;
  grouped_op op;
  op.kind = "segment loop over the experts";
  op.out_node = id;
  std::set<int64_t> seen;
  std::set<int> mask_inputs;
  for (const auto& t : terms) {
    if (!t.is_node())
      return std::nullopt;
    auto p = g.primitive(t.id);
    if (p == "broadcast_in_dim" || p == "convert_element_type") {
      // the zeros the sum starts from
      auto v = t;
      while (v.is_node() && (g.primitive(v.id) == "broadcast_in_dim" ||
                             g.primitive(v.id) == "convert_element_type"))
        v = g.operand(v.id, 0);
      if (!v.is_literal() || (v.literal != "0.0" && v.literal != "0"))
        return std::nullopt;
      continue;
    }
    value_ref dot, mask;
    if (p == "select_n" && g.operand_count(t.id) == 3) {
      auto zero = g.operand(t.id, 1);
      while (zero.is_node() && (g.primitive(zero.id) == "broadcast_in_dim" ||
                                g.primitive(zero.id) == "convert_element_type"))
        zero = g.operand(zero.id, 0);
      if (!zero.is_literal() || (zero.literal != "0.0" && zero.literal != "0"))
        return std::nullopt;
      mask = g.operand(t.id, 0);
      dot = g.operand(t.id, 2);
    } else if (p == "mul") {
      for (int side = 0; side < 2; ++side) {
        auto d = g.operand(t.id, side);
        if (d.is_node() && g.primitive(d.id) == "dot_general") {
          dot = d;
          mask = g.operand(t.id, 1 - side);
        }
      }
    }
    if (!dot.is_node() || g.primitive(dot.id) != "dot_general" || !mask.is_node())
      return std::nullopt;
    // the dot: x [M, K] . W[g] [K, N] (or [N, K])
    const auto& dp = g.params(dot.id);
    if (!ints(dp, "lhs_batch").empty() || ints(dp, "lhs_contracting") != std::vector<int64_t>{1})
      return std::nullopt;
    auto x = skip_widening(g, g.operand(dot.id, 0));
    auto wg = skip_widening(g, g.operand(dot.id, 1));
    auto rc = ints(dp, "rhs_contracting");
    // W[g]: squeeze(slice(W, g:g+1)) along W's first axis
    if (!wg.is_node() || g.primitive(wg.id) != "squeeze" || rc.size() != 1)
      return std::nullopt;
    auto sl = g.operand(wg.id, 0);
    if (!sl.is_node() || g.primitive(sl.id) != "slice")
      return std::nullopt;
    auto w = g.operand(sl.id, 0);
    auto ws = g.shape(w);
    auto lo = ints(g.params(sl.id), "start_indices"), hi = ints(g.params(sl.id), "limit_indices");
    if (ws.size() != 3 || lo.size() != 3 || hi.size() != 3 || hi[0] != lo[0] + 1 || lo[1] != 0 ||
        lo[2] != 0 || hi[1] != ws[1] || hi[2] != ws[2])
      return std::nullopt;
    bool transposed = rc[0] == 1;
    if (op.lhs.what == value_ref::kind::unknown) {
      op.lhs = x;
      op.rhs = w;
      op.transposed = transposed;
    } else if (x.what != op.lhs.what || x.id != op.lhs.id || w.what != op.rhs.what ||
               w.id != op.rhs.id || transposed != op.transposed) {
      return std::nullopt;
    }
    if (!seen.insert(lo[0]).second)
      return std::nullopt;
    for (int in : inputs_reached(g, mask))
      mask_inputs.insert(in);
  }
  auto xs = g.shape(op.lhs), ws = g.shape(op.rhs);
  if (xs.size() != 2 || ws.size() != 3 || static_cast<int64_t>(seen.size()) != ws[0] ||
      mask_inputs.size() != 1)
    return std::nullopt;
  op.m = xs[0];
  op.k = xs[1];
  op.g = ws[0];
  op.rhs_n_axis = op.transposed ? 1 : 2;
  op.n = ws[op.rhs_n_axis];
  if (out_shape != std::vector<int64_t>{op.m, op.n} || ws[op.transposed ? 2 : 1] != op.k)
    return std::nullopt;
  int in = *mask_inputs.begin();
  auto t = g.input_type(in);
  std::string dtype = t.getDtype().cStr();
  if (to_vector(t.getShape()) != std::vector<int64_t>{op.g} || dtype.find("int") == std::string::npos)
    return std::nullopt;
  op.groups = value_ref{value_ref::kind::input, in, ""};
  return op;
}

// Ids computed (in a loop: searchsorted) from one integer vector of G sizes and nothing else:
// read as the sorted layout, rows [offset_g, offset_g + sizes[g]) in group g.
bool ids_from_sizes(const graph_view& g, value_ref ids, int64_t groups, value_ref& sizes) {
  auto found = inputs_reached(g, ids);
  if (found.size() != 1)
    return false;
  int in = *found.begin();
  auto t = g.input_type(in);
  auto shape = to_vector(t.getShape());
  std::string dtype = t.getDtype().cStr();
  if (shape != std::vector<int64_t>{groups} || dtype.find("int") == std::string::npos)
    return false;
  sizes = value_ref{value_ref::kind::input, in, ""};
  return true;
}

struct gmm_facts_builder {
  const graph_view& g;
  schema::KernelSpec::Reader spec;
  std::string reason;

  std::optional<template_match> build(std::vector<grouped_op> ops) {
    auto args = make_workload_args(spec);
    if (args.graph_inputs.size() != g.input_count()) {
      reason = "the spec's inputs do not line up with the graph's";
      return std::nullopt;
    }
    dim_symbols dims(g, args.graph_inputs);
    dims.set_size_names(args.dim_names, args.reduced_by_value);
    replay_request req;
    // a kernel's result when an earlier kernel computes it (the glu feeding a down product)
    auto value_expr = [&](const value_ref& v) {
      if (v.is_node() && req.given.count(v.id))
        return req.given.at(v.id);
      return v.is_input() ? args.graph_inputs[v.id] : fmt::format("v{}", v.id);
    };
    req.inputs = args.graph_inputs;
    req.outputs = graph_outputs(g);
    std::string epilogues;
    nlohmann::json calls = nlohmann::json::array();
    for (size_t i = 0; i < ops.size(); ++i) {
      auto& op = ops[i];
      // rows computed in a loop from group sizes: the sorted layout
      if (op.by_ids) {
        replay_code probe;
        replay_request r2;
        r2.inputs = args.graph_inputs;
        r2.outputs = {op.groups};
        std::string why;
        value_ref sizes;
        if (!build_replay(g, dims, r2, probe, why)) {
          if (!ids_from_sizes(g, op.groups, op.g, sizes)) {
            reason = "the expert ids cannot be replayed: " + why;
            return std::nullopt;
          }
          op.groups = sizes;
          op.by_ids = false;
          op.kind += " (ids from group sizes)";
          op.note = "ids not replayed: " + why;
        }
      }
    }
    // Two products of the same rows, groups and width meeting in a glu: one kernel computes
    // both and applies the glu on its store (the grouped SwiGLU of a sparse MoE).
    auto same = [](const value_ref& x, const value_ref& y) { return x.what == y.what && x.id == y.id; };
    for (size_t i = 0; i < ops.size(); ++i)
      for (size_t j = i + 1; j < ops.size(); ++j) {
        auto& a = ops[i];
        auto& b = ops[j];
        if (a.absorbed || b.absorbed || a.partner >= 0 || b.partner >= 0 || !same(a.lhs, b.lhs) ||
            !same(a.groups, b.groups) || a.by_ids != b.by_ids || a.n != b.n || a.k != b.k ||
            g.dtype(node_ref(a.out_node)) != g.dtype(node_ref(b.out_node)))
          continue;
        int h = elementwise_join(g, a.out_node, b.out_node);
        if (h < 0)
          continue;
        a.partner = static_cast<int>(j);
        a.join = h;
        b.absorbed = true;
        a.kind += " (two products and their glu in one kernel)";
      }
    for (size_t i = 0; i < ops.size(); ++i) {
      auto& op = ops[i];
      if (op.absorbed)
        continue;
      auto n_expr = dims.dim_expr(op.rhs, op.rhs_n_axis);
      auto g_expr = dims.dim_expr(op.rhs, 0);
      if (n_expr.empty() || g_expr.empty()) {
        reason = "the weights' sizes are not tied to the inputs";
        return std::nullopt;
      }
      // The elementwise work after the product, fused into the kernel's store.
      epilogue_request er;
      er.space.resize(2);
      er.space[0].factors = {op.m};
      er.space[0].factor_exprs = {value_expr(op.lhs) + ".shape[0]"};
      er.space[1].factors = {op.n};
      er.space[1].factor_exprs = {n_expr};
      block_seed seed;
      seed.value = node_ref(op.out_node);
      if (!map_dims_to_factors({op.m, op.n}, er.space, seed.dims)) {
        reason = "the product's dims do not map onto rows and columns";
        return std::nullopt;
      }
      er.seeds = {seed};
      er.ends = chain_ends(g, op.out_node);
      const grouped_op* other = op.partner >= 0 ? &ops[static_cast<size_t>(op.partner)] : nullptr;
      if (other) {
        block_seed s2;
        s2.value = node_ref(other->out_node);
        s2.dims = seed.dims;
        er.seeds.push_back(s2);
        er.ends = chain_ends(g, op.join);
      }
      er.name = fmt::format("_epilogue_{}", i);
      std::string notes;
      auto fe = build_fused_epilogue(g, dims, er, notes);
      if (fe.end < 0) {
        reason = "no epilogue: " + notes;
        return std::nullopt;
      }
      int end = fe.end;
      op.chain.clear();
      for (auto it = er.ends.rbegin(); it != er.ends.rend(); ++it) {
        op.chain.push_back(*it);
        if (*it == end)
          break;
      }
      epilogues += "\n\n" + fe.code;
      std::string extras;
      for (const auto& e : fe.extras)
        extras += fmt::format("{}.reshape({}), ", args.graph_inputs.at(e.input), e.space_shape);
      std::string weights = fmt::format("({}, {}, 0)", value_expr(op.rhs),
                                        op.transposed ? "True" : "False");
      if (other)
        weights += fmt::format(", ({}, {}, 0)", value_expr(other->rhs),
                               other->transposed ? "True" : "False");
      weights = "[" + weights + "]";
      std::string tail = fmt::format("n={}, epilogue=_epilogue_{}, out_dtype={}, extras=[{}]",
                                     n_expr, i, py_dtype(g.dtype(node_ref(end))), extras);
      std::string call = op.by_ids
          ? fmt::format("y{} = _gmm_by_ids({}, {}, {}, {}, {})", i, value_expr(op.lhs), weights,
                        value_expr(op.groups), g_expr, tail)
          : fmt::format("y{} = _gmm({}, {}, {}, {})", i, value_expr(op.lhs), weights,
                        value_expr(op.groups), tail);
      req.given[end] = fmt::format("y{}", i);
      req.statements[end] = call;
      for (auto v : {op.lhs, op.rhs, op.groups, other ? other->rhs : op.rhs})
        if (v.is_node())
          req.outputs.push_back(v);
      calls.push_back({{"kind", op.kind}, {"m", op.m}, {"k", op.k}, {"n", op.n}, {"groups", op.g},
                       {"by_ids", op.by_ids}, {"transposed", op.transposed},
                       {"weights", other ? 2 : 1},
                       {"lhs_dtype", g.dtype(op.lhs)}, {"rhs_dtype", g.dtype(op.rhs)},
                       {"out_dtype", g.dtype(node_ref(end))},
                       {"epilogue", fe.primitives}, {"epilogue_by", fe.how},
                       {"extras", fe.extras.size()}, {"note", op.note + notes}});
    }
    replay_code body;
    if (!build_replay(g, dims, req, body, reason))
      return std::nullopt;
    double total = g.raw().getFlops();
    if (body.flops > 0.1 * total) {
      reason = fmt::format("the work around the grouped products is heavy ({:.3g} of {:.3g} flops)",
                           body.flops, total);
      return std::nullopt;
    }
    size_t n_out = g.output_count();
    std::string result;
    for (size_t k = 0; k < n_out; ++k)
      result += (k ? ", " : "") + body.outputs[k];
    if (n_out != 1)
      result = "(" + result + (n_out == 1 ? ",)" : ")");
    template_match m;
    m.family = "grouped_matmul";
    const auto& first = ops.front();
    m.summary = fmt::format("{} ({}x{} rows @ {} groups of {}x{}{}){}{}", first.kind, first.m,
                            first.k, first.g, first.k, first.n, first.transposed ? ", w transposed" : "",
                            calls.size() > 1 ? fmt::format(" and {} more", calls.size() - 1) : "",
                            first.chain.size() > 2 || (first.chain.size() == 2 &&
                                g.primitive(first.chain.back()) != "convert_element_type")
                                ? ", fused epilogue" : "");
    m.score = first.by_ids ? 0.9 : 1.0;
    m.facts = {{"calls", calls},
               {"signature", args.signature()},
               {"graph_inputs", [&] {
                  std::string s;
                  for (const auto& x : args.graph_inputs)
                    s += (s.empty() ? "" : ", ") + x;
                  return s;
                }()},
               {"body", body.code(4) + "    return " + result + "\n"},
               {"epilogues", epilogues},
               {"outside_primitives", body.primitives}};
    return m;
  }
};

int64_t vmem_for(const nlohmann::json& call, int64_t bm, int64_t bk, int64_t bn) {
  int64_t m = call["m"], k = call["k"], n = call["n"];
  std::string xd = call["lhs_dtype"], wd = call["rhs_dtype"], od = call["out_dtype"];
  int64_t ebm = effective_block(m, sublane_align(xd), bm);
  int64_t ebk = effective_block(k, 128, bk);
  int64_t ebn = effective_block(n, 128, bn);
  int64_t nw = call.value("weights", 1);
  return 2 * ebm * ebk * dtype_bytes(xd) + nw * 2 * ebk * ebn * dtype_bytes(wd) +
         2 * ebm * ebn * dtype_bytes(od) + nw * ebm * ebn * 4;
}

// Modeled time of one grouped call: x is read once per column block (per step when k is
// blocked), a group's weight block once per step that changes group (every step when k is
// blocked), the output once; plus the per-step overhead.
double modeled_us(const nlohmann::json& call, int64_t bm, int64_t bk, int64_t bn, double bw,
                  double step_us) {
  int64_t m = call["m"], k = call["k"], n = call["n"], groups = call["groups"];
  std::string xd = call["lhs_dtype"], wd = call["rhs_dtype"], od = call["out_dtype"];
  int64_t ebm = effective_block(m, sublane_align(xd), bm);
  int64_t ebk = effective_block(k, 128, bk);
  int64_t ebn = effective_block(n, 128, bn);
  double tiles = static_cast<double>(m / ebm), steps = tiles + groups - 1;
  double nb = static_cast<double>(n / ebn), kb = static_cast<double>(k / ebk);
  double x = nb * (kb == 1 ? m : steps * ebm) * k * dtype_bytes(xd);
  double w = (kb == 1 ? std::min(steps, 2.0 * groups) : steps) * k * n * dtype_bytes(wd) *
             call.value("weights", 1);
  double o = static_cast<double>(m) * n * dtype_bytes(od);
  return (x + w + o) / bw * 1e6 + nb * steps * kb * step_us;
}

class grouped_matmul_template final : public kernel_template {
public:
  std::string name() const override { return "grouped_matmul"; }
  std::string covers() const override {
    return "grouped / ragged matmul of mixture-of-experts rows by their experts' weights "
           "(ragged_dot, gathered expert weights, one-hot combines), group offsets in SMEM";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    std::vector<grouped_op> ops;
    for (unsigned id = 0; id < g.size(); ++id) {
      int n = static_cast<int>(id);
      if (g.in_loop(n))
        continue;
      if (auto op = match_ragged(g, n))
        ops.push_back(*op);
      else if (auto op = match_gathered(g, n))
        ops.push_back(*op);
      else if (auto op = match_onehot_combine(g, n))
        ops.push_back(*op);
      else if (auto op = match_segment_loop(g, n))
        ops.push_back(*op);
    }
    if (ops.empty())
      return std::nullopt;
    gmm_facts_builder b{g, spec, ""};
    return b.build(std::move(ops));
  }

  // The blocks with the least modeled time (HBM traffic at the chip's bandwidth plus the
  // per-step overhead) among aligned sizes that fit 3/4 of the scoped VMEM limit.
  nlohmann::json initial_params(const template_match& m, const config::chip& chip) const override {
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes * 3 / 4);
    double bw = chip.hbm_bandwidth * chip.efficiency.hbm / chip.devices_per_chip;
    if (bw <= 0)
      bw = 1e12;
    nlohmann::json best;
    double best_time = 0;
    for (int64_t bm : {2048, 1024, 512, 256, 128})
      for (int64_t bk : {2048, 1024, 512, 256})
        for (int64_t bn : {4096, 2048, 1024, 512, 256}) {
          nlohmann::json p = {{"block_m", bm}, {"block_k", bk}, {"block_n", bn},
                              {"n_semantics", "parallel"},
                              {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
          if (vmem_bytes(m, p) > budget)
            continue;
          double t = 0;
          for (const auto& c : m.facts["calls"])
            t += modeled_us(c, bm, bk, bn, bw, chip.efficiency.step_overhead_us);
          // within 2% of the best: the smaller VMEM (fewer bytes per step, faster tests)
          if (best.is_null() || t < best_time * 0.98 ||
              (t < best_time * 1.02 && vmem_bytes(m, p) < vmem_bytes(m, best))) {
            best = p;
            best_time = std::min(best_time == 0 ? t : best_time, t);
          }
        }
    if (best.is_null())
      best = {{"block_m", 128}, {"block_k", 256}, {"block_n", 256}, {"n_semantics", "parallel"},
              {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
    return best;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    const auto& c = m.facts["calls"][0];
    std::vector<tunable> t;
    tunable bm{"block_m", tunable::kind::block, c["m"].get<int64_t>(),
               sublane_align(c["lhs_dtype"].get<std::string>()), 1, 0, false, {},
               "rows per tile (work steps: tiles + groups - 1)"};
    tunable bk{"block_k", tunable::kind::block, c["k"].get<int64_t>(), 128, 2, 0, true, {},
               "contraction per step"};
    tunable bn{"block_n", tunable::kind::block, c["n"].get<int64_t>(), 128, 0, 0, false, {},
               "output columns per tile (x is read once per column block)"};
    tunable sem{"n_semantics", tunable::kind::choice, 0, 1, 0, 0, false,
                {"parallel", "arbitrary"}, "column blocks split across TensorCores or not"};
    tunable lim{"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false,
                {16 << 20, 32 << 20, 64 << 20, 100 << 20}, "scoped VMEM limit"};
    return {bm, bk, bn, sem, lim};
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const override {
    int64_t most = 0;
    for (const auto& c : m.facts["calls"])
      most = std::max(most, vmem_for(c, params.value("block_m", 512), params.value("block_k", 1024),
                                     params.value("block_n", 1024)));
    return most;
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    for (const char* key : {"block_m", "block_k", "block_n", "vmem_limit_bytes"})
      if (!params.contains(key) || !params[key].is_number_integer() || params[key].get<int64_t>() <= 0) {
        error = fmt::format("grouped_matmul: parameter {} must be a positive integer", key);
        return false;
      }
    std::string sem = params.value("n_semantics", "parallel");
    if (sem != "parallel" && sem != "arbitrary") {
      error = "grouped_matmul: n_semantics must be \"parallel\" or \"arbitrary\"";
      return false;
    }
    const auto& core = embedded_templates();
    auto it = core.find("gmm_core.py");
    if (it == core.end()) {
      error = "grouped_matmul: gmm_core.py is not embedded";
      return false;
    }
    return fill_template(
        "grouped_matmul.py",
        {{"summary", m.summary},
         {"params", params.dump()},
         {"block_m", std::to_string(params["block_m"].get<int64_t>())},
         {"block_k", std::to_string(params["block_k"].get<int64_t>())},
         {"block_n", std::to_string(params["block_n"].get<int64_t>())},
         {"n_semantics", sem},
         {"vmem_limit_bytes", std::to_string(params["vmem_limit_bytes"].get<int64_t>())},
         {"gmm_core", it->second},
         {"replay_prelude", replay_prelude()},
         {"epilogues", m.facts["epilogues"].get<std::string>()},
         {"graph_inputs", m.facts["graph_inputs"].get<std::string>()},
         {"signature", m.facts["signature"].get<std::string>()},
         {"body", m.facts["body"].get<std::string>()}},
        source, error);
  }
};

}  // namespace

template_ptr make_grouped_matmul_template() { return std::make_shared<grouped_matmul_template>(); }

}  // namespace maxkernel::agents::expert
