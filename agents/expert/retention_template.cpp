// Template retention: decay-weighted linear attention (RetNet's retention in its parallel
// form, and any attention whose weights are an elementwise function of the scores and of
// positions, without a softmax): out = R(n) * sum_m W(q_n . k_m, n, m) v_m, where W is any
// chain of elementwise ops on the scores, scalars and index-only tensors (decay matrices
// from iota: gamma^(n-m), masks), and R an optional row statistic over m of W (sum |W| ...)
// applied at the end. Matched on the computation: two dot_generals (q . k, then W . v over
// the key axis) with only elementwise ops, index-only values and row statistics between.
// The weights and statistics are generated code (block_program), so spellings of the decay
// (exp of a product, pow, cumsum differences, tril, where) do not matter; reductions of
// index-only values (the decay's row sums) are computed outside the kernel at full size.
// Refused: a softmax (exp of the scores with a running max: the attention family's), a
// statistic that is not a pure row statistic applied as a final scale, other matmuls,
// k and v layouts that differ from q's.
#include "agents/expert/block_program.hpp"
#include "agents/expert/block_size.hpp"
#include "agents/expert/index_evaluator.hpp"
#include "agents/expert/index_replay.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/softmax_attention_match.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_signature.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace maxkernel::agents::expert {

namespace {

using graph_facts::depends_on;
using graph_facts::index_evaluator;

value_ref node_ref(int k) { return value_ref{value_ref::kind::node, k, ""}; }

const std::set<std::string>& reductions() {
  static const std::set<std::string> r = {"reduce_sum", "reduce_max", "reduce_min",
                                          "reduce_prod", "argmax", "argmin", "cumsum",
                                          "reduce_and", "reduce_or", "cumprod", "cummax"};
  return r;
}

// Nodes between `from` (exclusive) and the leaves, walking operands back, stopping at `stop`.
std::vector<int> ancestry(const graph_view& g, const value_ref& from, int stop) {
  std::vector<int> out, stack;
  std::set<int> seen;
  if (from.is_node())
    stack.push_back(from.id);
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (!seen.insert(id).second || id == stop)
      continue;
    out.push_back(id);
    for (unsigned k = 0; k < g.operand_count(id); ++k) {
      auto o = g.operand(id, k);
      if (o.is_node())
        stack.push_back(o.id);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

value_ref strip_broadcasts(const graph_view& g, value_ref v) {
  while (v.is_node()) {
    auto p = g.primitive(v.id);
    if (p == "broadcast_in_dim" || p == "convert_element_type" || p == "reshape")
      v = g.operand(v.id, 0);
    else
      break;
  }
  return v;
}

struct qk_layout {
  std::vector<int> batch;  // q's batch dims in the dot's order
  int seq = -1, depth = -1;
};

// q . k over one feature dim, with one layout for both. false otherwise.
bool scores_layout(const graph_view& g, int dot, qk_layout& l, operand_trace& tq, operand_trace& tk) {
  const auto& p = g.params(dot);
  auto lc = p.value("lhs_contracting", std::vector<int>{});
  auto rc = p.value("rhs_contracting", std::vector<int>{});
  auto lb = p.value("lhs_batch", std::vector<int>{});
  auto rb = p.value("rhs_batch", std::vector<int>{});
  if (lc.size() != 1 || rc.size() != 1 || lb.size() != rb.size())
    return false;
  tq = trace_operand(g, g.operand(dot, 0));
  tk = trace_operand(g, g.operand(dot, 1));
  if (!tq.source.is_input() || !tk.source.is_input())
    return false;
  auto rank = tq.dims.size();
  if (rank != lb.size() + 2 || tk.dims.size() != rank)
    return false;
  std::vector<bool> used(rank, false);
  for (size_t i = 0; i < lb.size(); ++i) {
    int dq = tq.dims[static_cast<size_t>(lb[i])];
    if (dq != tk.dims[static_cast<size_t>(rb[i])])
      return false;
    l.batch.push_back(dq);
    used[static_cast<size_t>(dq)] = true;
  }
  l.depth = tq.dims[static_cast<size_t>(lc[0])];
  if (l.depth != tk.dims[static_cast<size_t>(rc[0])])
    return false;
  used[static_cast<size_t>(l.depth)] = true;
  for (size_t d = 0; d < rank; ++d)
    if (!used[d])
      l.seq = static_cast<int>(d);
  // the score dot's result must be [batch..., n, m]: lhs free before rhs free (always so)
  return l.seq >= 0;
}

// The permutation taking an input's dims to (batch..., seq, feature).
std::vector<int> canonical_perm(const qk_layout& l) {
  std::vector<int> p = l.batch;
  p.push_back(l.seq);
  p.push_back(l.depth);
  return p;
}

class retention_template final : public kernel_template {
public:
  std::string name() const override { return "retention"; }
  std::string covers() const override {
    return "decay-weighted linear attention (RetNet retention): weights an elementwise "
           "function of q.k and positions, optional row normalisation, chunked over keys";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    if (g.output_count() != 1)
      return std::nullopt;
    auto ot = trace_operand(g, g.output(0));
    if (!ot.source.is_node() || g.primitive(ot.source.id) != "dot_general")
      return std::nullopt;
    int d2 = ot.source.id;
    if (g.in_loop(d2))
      return std::nullopt;
    // W . v: one side an input (v), the other computed from a q . k dot.
    const auto& dn2 = g.params(d2);
    auto lc2 = dn2.value("lhs_contracting", std::vector<int>{});
    auto rc2 = dn2.value("rhs_contracting", std::vector<int>{});
    auto lb2 = dn2.value("lhs_batch", std::vector<int>{});
    auto rb2 = dn2.value("rhs_batch", std::vector<int>{});
    if (lc2.size() != 1 || rc2.size() != 1)
      return std::nullopt;
    // W on either side (einsum picks the operand order): w_side is W's, the other is v.
    int w_side = -1;
    operand_trace side_t[2] = {trace_operand(g, g.operand(d2, 0)), trace_operand(g, g.operand(d2, 1))};
    for (int sd = 0; sd < 2; ++sd)
      if (side_t[1 - sd].source.is_input() && side_t[sd].source.is_node() && w_side < 0)
        w_side = sd;
    if (w_side < 0)
      return std::nullopt;
    auto t1 = side_t[1 - w_side];
    auto w_val = g.operand(d2, static_cast<unsigned>(w_side));
    if (w_side == 1) {  // read the dims as if W were the lhs
      std::swap(lc2, rc2);
      std::swap(lb2, rb2);
    }
    // The q . k dot: the only dot_general W depends on.
    int d1 = -1;
    for (int d : g.find("dot_general"))
      if (d != d2 && depends_on(g, w_val, d)) {
        if (d1 >= 0)
          return std::nullopt;
        d1 = d;
      }
    if (d1 < 0 || g.in_loop(d1))
      return std::nullopt;
    qk_layout lay;
    operand_trace tq, tk;
    if (!scores_layout(g, d1, lay, tq, tk))
      return std::nullopt;
    auto sshape = g.shape(node_ref(d1));
    size_t nb = lay.batch.size();
    // W must be score-shaped with D2 contracting its key axis, batching its batch axes.
    if (g.shape(w_val) != sshape || lc2[0] != static_cast<int>(nb + 1) || lb2.size() != nb)
      return std::nullopt;
    for (size_t i = 0; i < nb; ++i)
      if (lb2[i] != static_cast<int>(i))
        return std::nullopt;
    // v in q's layout: batch dims, then seq contracted, feature free.
    int v_in = t1.source.id;
    std::vector<int> v_dims;
    for (size_t i = 0; i < nb; ++i)
      if (t1.dims[static_cast<size_t>(rb2[i])] != lay.batch[i])
        return std::nullopt;
    if (t1.dims[static_cast<size_t>(rc2[0])] != lay.seq)
      return std::nullopt;
    // Softmax-like weights belong to the attention family: no exp/max of score values.
    auto w_nodes = ancestry(g, w_val, d1);
    for (int id : w_nodes) {
      auto p = g.primitive(id);
      if (p == "dot_general" || p == "while" || p == "scan" || p == "cond")
        return std::nullopt;
    }
    index_evaluator ev(g);
    // The row scale applied last: W = X / R or X * R with R a row statistic of the scores.
    auto w_core = trace_operand(g, w_val);  // through casts and scalar factors
    value_ref x_val = w_val, r_val;
    std::string row_scale = "None";
    if (w_core.source.is_node() && (g.primitive(w_core.source.id) == "div" ||
                                    g.primitive(w_core.source.id) == "mul")) {
      int id = w_core.source.id;
      for (unsigned side = 0; side < 2; ++side) {
        if (g.primitive(id) == "div" && side == 0)
          continue;
        auto r = g.operand(id, side);
        auto rs = g.shape(strip_broadcasts(g, r));
        bool row = !rs.empty() && rs.back() == 1 && r.is_node() &&
                   depends_on(g, r, d1);
        if (row) {
          r_val = strip_broadcasts(g, r);
          x_val = g.operand(id, 1 - side);
          row_scale = g.primitive(id) == "div" ? "\"div\"" : "\"mul\"";
          break;
        }
      }
    }
    if (w_core.scale != 1.0 && row_scale != "None")
      return std::nullopt;  // a factor after the row scale: keep it simple, refuse
    std::set<int> all_nodes;
    for (int id : ancestry(g, x_val, d1))
      all_nodes.insert(id);
    if (r_val.is_node())
      for (int id : ancestry(g, r_val, d1))
        all_nodes.insert(id);
    // A score-dependent reduction is only allowed as (inside) the row statistic.
    for (int id : all_nodes) {
      if (!reductions().count(g.primitive(id)) || ev.index_only(node_ref(id)))
        continue;
      bool in_r = r_val.is_node() && (r_val.id == id || depends_on(g, r_val, id));
      bool in_x = depends_on(g, x_val, id) || (x_val.is_node() && x_val.id == id);
      if (in_x || !in_r)
        return std::nullopt;
    }
    // Seeds: the index-only values that do not span both n and m (head constants, position
    // vectors, the decay's row sums), where they meet bigger values. They are replayed at
    // full size outside the kernel (XLA fuses any reduction in them); the tile code builds
    // the rest (the [n, m] decay) from them.
    std::map<int, std::vector<int>> placed;  // index-only node -> score dim per own dim
    auto small = [&](int id) {
      auto it = placed.find(id);
      if (it == placed.end()) {
        auto pl = graph_facts::place_forward(g, id, sshape, d1);
        it = placed.emplace(id, pl).first;
      }
      if (it->second.empty())
        return false;
      bool n = false, mm = false;
      for (int d : it->second) {
        n = n || d == static_cast<int>(nb);
        mm = mm || d == static_cast<int>(nb + 1);
      }
      return !(n && mm);
    };
    auto present_anywhere = [&](int id) {
      for (int d : placed[id])
        if (d >= 0)
          return true;
      return false;
    };
    std::vector<int> seeds;
    for (int id : all_nodes) {
      if (!ev.index_only(node_ref(id)) || !small(id) || !present_anywhere(id))
        continue;
      bool frontier = false;
      for (int c : g.consumers(id))
        if (all_nodes.count(c) || (x_val.is_node() && c == x_val.id) ||
            (r_val.is_node() && c == r_val.id))
          frontier = frontier || !ev.index_only(node_ref(c)) || !small(c);
      if (frontier)
        seeds.push_back(id);
    }
    // Programs: space = (batch axes..., n, m).
    std::vector<int> qperm = canonical_perm(lay);
    auto qshape = g.shape(tq.source);
    std::vector<space_axis> space;
    for (size_t i = 0; i < nb; ++i) {
      space_axis a;
      a.factors = {sshape[i]};
      a.factor_exprs = {fmt::format("q.shape[{}]", i)};
      a.squeezed = true;
      space.push_back(a);
    }
    space_axis an, am;
    an.factors = {sshape[nb]};
    an.factor_exprs = {fmt::format("q.shape[{}]", nb)};
    am.factors = {sshape[nb + 1]};
    am.factor_exprs = {fmt::format("k.shape[{}]", nb)};
    space.push_back(an);
    space.push_back(am);
    block_seed score_seed;
    score_seed.value = node_ref(d1);
    if (!map_dims_to_factors(sshape, space, score_seed.dims))
      return std::nullopt;
    std::string why;
    // Row seeds: index-only reductions replayed at full size outside the kernel (XLA fuses
    // them), placed onto the space by where they meet the scores.
    std::vector<block_seed> seed_list = {score_seed};
    nlohmann::json seed_present = nlohmann::json::array();
    std::string seed_code;
    if (!seeds.empty()) {
      std::map<int64_t, std::string> sizes;
      sizes[sshape[nb]] = fmt::format("q.shape[{}]", nb);
      sizes.emplace(sshape[nb + 1], fmt::format("k.shape[{}]", nb));
      for (size_t i = 0; i < nb; ++i)
        sizes.emplace(sshape[i], fmt::format("q.shape[{}]", i));
      std::string lines;
      if (!graph_facts::replay_index_only(g, seeds, sizes, lines, why))
        return std::nullopt;
      std::string outs;
      for (int sd : seeds) {
        auto place = placed[sd];
        auto sdshape = g.shape(node_ref(sd));
        if (place.size() != sdshape.size())
          return std::nullopt;
        block_seed bs;
        bs.value = node_ref(sd);
        std::vector<std::pair<int, int>> order;  // (axis, seed dim)
        nlohmann::json present = nlohmann::json::array();
        for (size_t i = 0; i < place.size(); ++i) {
          bs.dims.push_back(place[i] < 0 ? dim_map{} : dim_map{place[i], 0, 1});
          if (place[i] >= 0)
            order.push_back({place[i], static_cast<int>(i)});
          else if (sdshape[i] != 1)
            return std::nullopt;
        }
        std::sort(order.begin(), order.end());
        std::string perm = "(", shape = "(";
        for (auto [a, i] : order)
          perm += std::to_string(i) + ", ";
        for (size_t i = 0; i < place.size(); ++i)
          if (place[i] < 0)
            perm += std::to_string(i) + ", ";
        for (size_t a = 0; a < nb + 2; ++a) {
          bool here = false;
          for (auto [ax, i] : order)
            here = here || ax == static_cast<int>(a);
          present.push_back(here);
          shape += here ? (a == nb + 1 ? fmt::format("k.shape[{}]", nb)
                                       : fmt::format("q.shape[{}]", a))
                        : std::string("1");
          shape += ", ";
        }
        outs += fmt::format("jnp.transpose(t{}, {}).reshape({}), ", sd, perm + ")", shape + ")");
        seed_present.push_back(present);
        seed_list.push_back(bs);
      }
      seed_code = "def row_seeds(q, k, v):\n" + indent("    " + lines, 4) +
                  "    return [" + outs + "]\n";
    }
    // P1: the weights X of one tile.
    block_request r1;
    r1.space = space;
    r1.seeds = seed_list;
    r1.outputs = {x_val};
    r1.name = "weights";
    block_program p1;
    if (!build_block_program(g, r1, p1, why))
      return std::nullopt;
    if (p1.reduced.size() == nb + 2 && (p1.reduced[nb] || p1.reduced[nb + 1]))
      return std::nullopt;  // a reduction over a blocked axis inside the weights
    // P2: the row statistic, streamed along m.
    block_program p2;
    if (r_val.is_node()) {
      block_request r2 = r1;
      r2.outputs = {r_val};
      r2.name = "row_stat";
      r2.stream_axis = static_cast<int>(nb + 1);
      if ((!build_block_program(g, r2, p2, why) || !p2.streamable))
        return std::nullopt;
      if (!p2.operands.empty()) {
        if (p2.operands.size() != p1.operands.size())
          return std::nullopt;
        for (size_t i = 0; i < p2.operands.size(); ++i)
          if (p2.operands[i].input != p1.operands[i].input)
            return std::nullopt;
      }
    }
    for (const auto& o : p1.operands)
      if (o.scalar)
        return std::nullopt;  // scalars as extras: not wired here
    bool causal = zero_above_diagonal(g, x_val, sshape) && zero_preserving_stat(g, r_val, x_val);
    // The output: the kernel writes [batch..., n, dv]; the reference reads D2's result
    // through ot.dims.
    // kernel dims (batch..., n, dv) -> D2's result dims: (batch..., n, dv) with W on the left,
    // (batch..., dv, n) with W on the right
    std::vector<int> out_perm = ot.dims;
    if (w_side == 1)
      for (auto& d : out_perm)
        d = d == static_cast<int>(nb) ? static_cast<int>(nb + 1)
            : d == static_cast<int>(nb + 1) ? static_cast<int>(nb) : d;
    std::vector<int> vperm = qperm;  // v in q's layout (checked above)
    nlohmann::json extras = nlohmann::json::array();
    nlohmann::json layouts = nlohmann::json::array();
    for (const auto& o : p1.operands) {
      extras.push_back(o.input);
      layouts.push_back({{"space_shape", o.space_shape}, {"present", o.present}});
    }
    std::string pv_dtype = g.dtype(w_val) == "float32" || g.dtype(g.operand(d2, 1)) == "float32"
                               ? "float32" : t1.narrowest;
    std::string qk_dtype = tq.narrowest == tk.narrowest ? tq.narrowest : "float32";
    template_match m;
    m.family = name();
    m.summary = fmt::format("retention: scores {}x{} over {} batch axes, weights from {} ops{}{}{}",
                            sshape[nb], sshape[nb + 1], nb, p1.primitives.size(),
                            seeds.empty() ? "" : fmt::format(", {} index-only row seed(s)", seeds.size()),
                            r_val.is_node() ? ", row-normalised" : "", causal ? ", causal" : "");
    m.facts = {{"q", tq.source.id}, {"k", tk.source.id}, {"v", v_in},
               {"q_perm", qperm}, {"k_perm", qperm}, {"v_perm", vperm}, {"out_perm", out_perm},
               {"num_batch", nb}, {"seq_q", sshape[nb]}, {"seq_k", sshape[nb + 1]},
               {"depth", qshape[static_cast<size_t>(lay.depth)]},
               {"dv", g.shape(t1.source)[static_cast<size_t>(lay.depth)]},
               {"row_scale", row_scale}, {"causal", causal}, {"out_scale", w_core.scale * ot.scale},
               {"qk_scale", tq.scale * tk.scale},
               {"seed_code", seed_code}, {"weights_code", p1.code}, {"stat_code", p2.stream_code},
               {"seed_present", seed_present}, {"extras", extras}, {"extra_layouts", layouts},
               {"acc_dtypes", p2.accumulator_dtypes}, {"out_dtype", g.dtype(g.output(0))},
               {"in_dtype", g.dtype(tq.source)}, {"qk_dtype", qk_dtype}, {"pv_dtype", pv_dtype},
               {"signature", signature_facts(make_signature(spec))}};
    m.score = 1.0;
    return m;
  }

  nlohmann::json initial_params(const template_match& m,
                                const config::chip& chip) const override {
    int64_t sq = m.facts["seq_q"], sk = m.facts["seq_k"];
    nlohmann::json p = {{"block_q", effective_block(sq, 128, 512)},
                        {"block_k", effective_block(sk, 128, 512)},
                        {"pv_dtype", m.facts["pv_dtype"]},
                        {"dimension_semantics", {"parallel", "parallel"}},
                        {"vmem_limit_bytes", chip.scoped_vmem_bytes}};
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes) * 3 / 4;
    for (int guard = 0; guard < 8 && vmem_bytes(m, p) > budget; ++guard) {
      const char* big = p["block_q"].get<int64_t>() >= p["block_k"].get<int64_t>() ? "block_q" : "block_k";
      if (p[big].get<int64_t>() <= 128)
        break;
      p[big] = p[big].get<int64_t>() / 2;
    }
    return p;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    int nb = m.facts["num_batch"];
    return {
        {"block_q", tunable::kind::block, m.facts["seq_q"], 128, nb, 0, false, {},
         "query rows per block"},
        {"block_k", tunable::kind::block, m.facts["seq_k"], 128, nb + 1, 0, true, {},
         "keys per step (the chunk carried in the accumulator)"},
        {"pv_dtype", tunable::kind::choice, 0, 1, -1, 0, false, {"float32", "bfloat16"},
         "dtype of the weights . v matmul operands"},
        {"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
         {nlohmann::json{"parallel", "parallel"}, nlohmann::json{"parallel", "arbitrary"}},
         "grid axes split across TensorCores"},
        {"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {}, "scoped VMEM limit"},
    };
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const override {
    int64_t sq = m.facts["seq_q"], sk = m.facts["seq_k"];
    int64_t d = m.facts["depth"], dv = m.facts["dv"];
    int64_t bq = effective_block(sq, 128, params.value("block_q", int64_t{512}));
    int64_t bk = effective_block(sk, 128, params.value("block_k", int64_t{512}));
    int64_t in = dtype_bytes(m.facts["in_dtype"]);
    auto lanes = [](int64_t x) { return std::max<int64_t>(x, 128); };
    int64_t blocks = 2 * (bq * lanes(d) + bk * lanes(d) + bk * lanes(dv)) * in;
    int64_t seeds = 2 * static_cast<int64_t>(m.facts["seed_present"].size()) * bq * 128 * 4;
    int64_t out = 2 * bq * lanes(dv) * dtype_bytes(m.facts["out_dtype"]);
    int64_t scratch = bq * lanes(dv) * 4 + static_cast<int64_t>(m.facts["acc_dtypes"].size()) * bq * 128 * 4;
    int64_t temps = 6 * bq * bk * 4;  // scores, weights and the generated code's temporaries
    return blocks + seeds + out + scratch + temps;
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    for (const char* b : {"block_q", "block_k"})
      if (!params.contains(b) || !params[b].is_number_integer() || params[b].get<int64_t>() < 1) {
        error = std::string("param ") + b + " must be a positive integer";
        return false;
      }
    auto pv = params.value("pv_dtype", std::string());
    if (pv != "bfloat16" && pv != "float32") {
      error = "param pv_dtype must be bfloat16 or float32";
      return false;
    }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number()) {
      error = "param vmem_limit_bytes must be a number";
      return false;
    }
    const auto& sig = m.facts["signature"];
    auto name_of = [&](int k) {
      return sig["names"][sig["graph_inputs"][static_cast<size_t>(k)].get<size_t>()].get<std::string>();
    };
    std::string extras, layout = "[";
    for (size_t i = 0; i < m.facts["extras"].size(); ++i) {
      extras += (i ? ", " : "") + name_of(m.facts["extras"][i]);
      const auto& l = m.facts["extra_layouts"][i];
      layout += fmt::format("(lambda q, k, v: {}, {}), ", l["space_shape"].get<std::string>(),
                            python_literal(l["present"]));
    }
    layout += "]";
    std::string seed_code = m.facts["seed_code"].get<std::string>();
    if (seed_code.empty())
      seed_code = "def row_seeds(q, k, v):\n    return []\n";
    std::string stat_code = m.facts["stat_code"].get<std::string>();
    if (stat_code.empty())
      stat_code = "row_stat_init = row_stat_step = row_stat_final = None\n";
    nlohmann::json py = params;
    py["qk_dtype"] = m.facts["qk_dtype"];
    py["out_scale"] = m.facts["out_scale"];
    py["qk_scale"] = m.facts["qk_scale"];
    return fill_template("retention.py",
                         {{"header", header_comment(name(), m.summary, params.dump())},
                          {"params", python_literal(py)},
                          {"num_batch", std::to_string(m.facts["num_batch"].get<int>())},
                          {"q_perm", m.facts["q_perm"].dump()},
                          {"k_perm", m.facts["k_perm"].dump()},
                          {"v_perm", m.facts["v_perm"].dump()},
                          {"out_perm", m.facts["out_perm"].dump()},
                          {"row_scale", m.facts["row_scale"].get<std::string>()},
                          {"causal_skip", m.facts["causal"].get<bool>() ? "True" : "False"},
                          {"out_dtype", m.facts["out_dtype"].get<std::string>()},
                          {"seed_code", seed_code},
                          {"weights_code", m.facts["weights_code"].get<std::string>()},
                          {"stat_code", stat_code},
                          {"args", sig["args"].get<std::string>()},
                          {"q", name_of(m.facts["q"])}, {"k", name_of(m.facts["k"])},
                          {"v", name_of(m.facts["v"])},
                          {"extras", extras},
                          {"seed_present", python_literal(m.facts["seed_present"])},
                          {"extra_layout", layout},
                          {"acc_dtypes", python_literal(m.facts["acc_dtypes"])}},
                         source, error);
  }

private:
  // Every weight with key index above the query index is zero: some multiplicative factor
  // (or select) of X built from indices only is zero there, read at sample points.
  static bool zero_above_diagonal(const graph_view& g, const value_ref& x,
                                  const std::vector<int64_t>& sshape) {
    index_evaluator ev(g);
    auto rank = sshape.size();
    int64_t sq = sshape[rank - 2], sk = sshape[rank - 1];
    auto zero_upper = [&](const value_ref& f, bool want_zero_case, int keep_case) {
      // f index-only: true when zero (or, for a predicate, selecting the zero case) above
      auto fs = g.shape(f);
      for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{5}, sq / 2, sq - 2})
        for (int64_t c : {r + 1, r + 2, r + 7, sk - 1}) {
          if (r < 0 || c <= r || c >= sk || r >= sq)
            continue;
          std::vector<int64_t> idx(fs.size(), 0);
          if (fs.size() >= 2) {
            idx[fs.size() - 2] = fs[fs.size() - 2] == 1 ? 0 : r;
            idx[fs.size() - 1] = fs[fs.size() - 1] == 1 ? 0 : c;
          }
          auto v = ev.at(f, idx);
          if (!v)
            return false;
          if (!want_zero_case && *v != 0)
            return false;
          if (want_zero_case && static_cast<int>(*v != 0) == keep_case)
            return false;
        }
      return true;
    };
    std::vector<value_ref> stack = {x};
    for (int guard = 0; guard < 64 && !stack.empty(); ++guard) {
      auto v = stack.back();
      stack.pop_back();
      if (!v.is_node())
        continue;
      if (ev.index_only(v)) {
        if (g.shape(v).size() >= 2 && zero_upper(v, false, 0))
          return true;
        continue;
      }
      auto p = g.primitive(v.id);
      if (p == "mul") {
        stack.push_back(g.operand(v.id, 0));
        stack.push_back(g.operand(v.id, 1));
      } else if (p == "div" || p == "convert_element_type" || p == "broadcast_in_dim") {
        stack.push_back(g.operand(v.id, 0));
      } else if (p == "select_n" && g.operand_count(v.id) == 3) {
        auto pred = g.operand(v.id, 0);
        auto z0 = scalar_value(g, g.operand(v.id, 1)), z1 = scalar_value(g, g.operand(v.id, 2));
        if (ev.index_only(pred) && ((z0 && *z0 == 0 && zero_upper(pred, true, 1)) ||
                                    (z1 && *z1 == 0 && zero_upper(pred, true, 0))))
          return true;
      }
    }
    return false;
  }

  // The row statistic sums something that is zero where X is (so skipped tiles add nothing).
  static bool zero_preserving_stat(const graph_view& g, const value_ref& r, const value_ref& x) {
    if (!r.is_node())
      return true;
    // find the reductions R depends on; each must read X through zero-preserving ops
    auto feeds_x = ancestry(g, x, -1);
    for (int id : ancestry(g, r, -1)) {
      auto p = g.primitive(id);
      if (!reductions().count(p) || std::binary_search(feeds_x.begin(), feeds_x.end(), id))
        continue;
      if (p != "reduce_sum")
        return false;
      auto v = g.operand(id, 0);
      for (int guard = 0; guard < 16 && v.is_node() && !(x.is_node() && v.id == x.id); ++guard) {
        auto q = g.primitive(v.id);
        if (q == "abs" || q == "convert_element_type" || q == "square" || q == "neg" ||
            (q == "integer_pow" && g.params(v.id).value("y", 0) > 0))
          v = g.operand(v.id, 0);
        else if (q == "mul" && scalar_value(g, g.operand(v.id, 1)))
          v = g.operand(v.id, 0);
        else
          return false;
      }
      if (!(x.is_node() && v.is_node() && v.id == x.id))
        return false;
    }
    return true;
  }
};

}  // namespace

template_ptr make_retention_template() { return std::make_shared<retention_template>(); }

}  // namespace maxkernel::agents::expert
