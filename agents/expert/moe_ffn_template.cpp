// Template moe_ffn: a mixture-of-experts feed-forward block written densely, as MaxText's
// dense path and many references do: every expert's gated MLP on every token,
// glu(x @ Wg[e], x @ Wu[e]) @ Wd[e], then the expert outputs contracted with per-token combine
// weights that are zero for the experts a token does not use. Recognised on the graph:
//  - gate / up: dot_generals of the tokens x [..., E] with per-expert weights [X, E, F] (or
//    [X, F, E]), no batch dims, result [..., X, F];
//  - glu: an elementwise region whose only non-constant leaves are those two products;
//  - down: a dot_general batched over the experts with weights [X, F, E2] (or [X, E2, F]),
//    maybe transposed back to [..., X, E2];
//  - combine: a dot_general of the (maybe widened) expert outputs with weights C [..., X],
//    batched over the token dims and contracting the experts.
// The kernel runs the routed rows only: the replayed routing gives C, each token's top-k
// experts are C's k largest entries (k of the routing's top_k, else every expert), and two
// grouped matmuls do the expert MLPs (grouped_matmul's core). Refused: routing that cannot
// be replayed (loops), expert weights that are not per-expert rank-3 arrays, or routing
// heavier than 10% of the flops.
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
bool same_value(const value_ref& a, const value_ref& b) { return a.what == b.what && a.id == b.id; }

// x [..., E] . W [X, E, F] (or [X, F, E]) -> [..., X, F], x the lhs.
struct expert_projection {
  int dot = -1;
  value_ref x, w;
  bool transposed = false;
  int64_t e = 0, f = 0, experts = 0;
  std::vector<int64_t> lead;
};

std::optional<expert_projection> match_expert_projection(const graph_view& g, int id) {
  if (g.primitive(id) != "dot_general" || g.in_loop(id))
    return std::nullopt;
  const auto& p = g.params(id);
  if (!ints(p, "lhs_batch").empty() || ints(p, "lhs_contracting").size() != 1)
    return std::nullopt;
  auto xs = g.shape(g.operand(id, 0)), ws = g.shape(g.operand(id, 1));
  auto lc = ints(p, "lhs_contracting")[0], rc = ints(p, "rhs_contracting")[0];
  if (xs.size() < 2 || ws.size() != 3 || lc != static_cast<int64_t>(xs.size()) - 1 || rc == 0)
    return std::nullopt;
  expert_projection e;
  e.dot = id;
  e.x = skip_widening(g, g.operand(id, 0));
  e.w = skip_widening(g, g.operand(id, 1));
  e.transposed = rc == 2;
  e.e = xs.back();
  e.f = ws[rc == 2 ? 1 : 2];
  e.experts = ws[0];
  e.lead.assign(xs.begin(), xs.end() - 1);
  return e;
}

bool constant_leaf(const graph_view& g, value_ref v) {
  for (int depth = 0; depth < 4 && v.is_node(); ++depth) {
    auto p = g.primitive(v.id);
    if (p != "broadcast_in_dim" && p != "convert_element_type")
      return false;
    if (p == "broadcast_in_dim" && g.node(v.id).getOperands()[0].getShape().size() != 0)
      return false;
    v = g.operand(v.id, 0);
  }
  return v.is_literal();
}

// The two expert projections an elementwise region ending at h reads.
std::optional<std::pair<expert_projection, expert_projection>> expert_glu(const graph_view& g,
                                                                          int h) {
  std::vector<int> seeds;
  std::vector<int> stack{h};
  std::set<int> seen;
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second)
      continue;
    if (n != h && match_expert_projection(g, n)) {
      if (std::find(seeds.begin(), seeds.end(), n) == seeds.end())
        seeds.push_back(n);
      continue;
    }
    if (!is_elementwise(g.primitive(n)) || g.in_loop(n))
      return std::nullopt;
    for (unsigned k = 0; k < g.operand_count(n); ++k) {
      auto v = g.operand(n, k);
      if (v.is_literal() || constant_leaf(g, v))
        continue;
      if (!v.is_node())
        return std::nullopt;
      stack.push_back(v.id);
    }
  }
  if (seeds.size() != 2)
    return std::nullopt;
  std::sort(seeds.begin(), seeds.end());
  auto a = match_expert_projection(g, seeds[0]), b = match_expert_projection(g, seeds[1]);
  if (!same_value(a->x, b->x) || a->e != b->e || a->f != b->f || a->lead != b->lead ||
      a->experts != b->experts)
    return std::nullopt;
  auto want = a->lead;
  want.push_back(a->experts);
  want.push_back(a->f);
  if (g.shape(node_ref(h)) != want)
    return std::nullopt;
  return std::make_pair(*a, *b);
}

// Axis roles of the expert outputs: token dim i (>= 0), experts (-1), output features (-2).
constexpr int kExpert = -1, kFeature = -2;

struct moe_found {
  expert_projection gate, up;
  int h = -1;
  value_ref wd;
  bool td = false;             // wd [X, E2, F]
  int64_t n = 0;               // E2
  int combine = -1;            // the combine dot_general
  value_ref weights;           // C
  std::vector<int> c_roles;    // per axis of C: token dim i or kExpert
  int top_k = 0;
};

std::optional<moe_found> find_moe(const graph_view& g, std::string& why) {
  for (int h = static_cast<int>(g.size()) - 1; h >= 0; --h) {
    if (!is_elementwise(g.primitive(h)))
      continue;
    auto pr = expert_glu(g, h);
    if (!pr)
      continue;
    bool extended = false;
    for (int c : g.consumers(h))
      extended = extended || (is_elementwise(g.primitive(c)) && expert_glu(g, c));
    if (extended)
      continue;
    moe_found m;
    m.gate = pr->first;
    m.up = pr->second;
    m.h = h;
    int rank = static_cast<int>(m.gate.lead.size());  // token dims
    const auto& cons = g.consumers(h);
    if (cons.size() != 1 || g.primitive(cons[0]) != "dot_general") {
      why = "the experts' glu does not feed one down projection";
      return std::nullopt;
    }
    int d = cons[0];
    const auto& p = g.params(d);
    auto lb = ints(p, "lhs_batch"), rb = ints(p, "rhs_batch");
    auto lc = ints(p, "lhs_contracting"), rc = ints(p, "rhs_contracting");
    if (lb.size() != 1 || lc.size() != 1) {
      why = "the down projection is not batched over the experts";
      return std::nullopt;
    }
    int hside = g.operand(d, 0).is_node() && g.operand(d, 0).id == h ? 0 : 1;
    auto wv = g.operand(d, 1 - hside);
    auto ws = g.shape(wv);
    auto hb = hside == 0 ? lb[0] : rb[0], hc = hside == 0 ? lc[0] : rc[0];
    auto wb = hside == 0 ? rb[0] : lb[0], wc = hside == 0 ? rc[0] : lc[0];
    if (ws.size() != 3 || hb != rank || hc != rank + 1 || wb != 0 || wc == 0 ||
        ws[0] != m.gate.experts || ws[wc] != m.gate.f) {
      why = "the down projection's weights are not per-expert [X, F, E2]";
      return std::nullopt;
    }
    m.wd = skip_widening(g, wv);
    m.td = wc == 2;
    m.n = ws[wc == 2 ? 1 : 2];
    // roles of the down output: batch (experts), lhs free dims, rhs free dims
    std::vector<int> roles{kExpert};
    auto free_roles = [&](int side) {
      if (side == hside)
        for (int a = 0; a < rank; ++a)
          roles.push_back(a);
      else
        roles.push_back(kFeature);
    };
    free_roles(0);
    free_roles(1);
    // through a transpose and widening casts to the combine
    int y = d;
    for (int guard = 0; guard < 4; ++guard) {
      const auto& next = g.consumers(y);
      if (next.size() != 1)
        break;
      int c = next[0];
      auto pc = g.primitive(c);
      if (pc == "transpose") {
        auto perm = ints(g.params(c), "permutation");
        std::vector<int> r2;
        for (auto a : perm)
          r2.push_back(roles.at(static_cast<size_t>(a)));
        roles = r2;
        y = c;
      } else if (pc == "convert_element_type" &&
                 skip_widening(g, node_ref(c)).id == y) {
        y = c;
      } else {
        break;
      }
    }
    const auto& yc = g.consumers(y);
    if (yc.size() != 1 || g.primitive(yc[0]) != "dot_general") {
      why = "the expert outputs are not combined by one dot_general";
      return std::nullopt;
    }
    int comb = yc[0];
    const auto& cp = g.params(comb);
    int yside = g.operand(comb, 0).is_node() && g.operand(comb, 0).id == y ? 0 : 1;
    auto ybatch = ints(cp, yside == 0 ? "lhs_batch" : "rhs_batch");
    auto cbatch = ints(cp, yside == 0 ? "rhs_batch" : "lhs_batch");
    auto ycon = ints(cp, yside == 0 ? "lhs_contracting" : "rhs_contracting");
    auto ccon = ints(cp, yside == 0 ? "rhs_contracting" : "lhs_contracting");
    auto cv = g.operand(comb, 1 - yside);
    auto cs = g.shape(cv);
    if (ycon.size() != 1 || roles.at(static_cast<size_t>(ycon[0])) != kExpert ||
        ybatch.size() != static_cast<size_t>(rank) || cs.size() != static_cast<size_t>(rank) + 1) {
      why = "the combine does not contract the experts batched over the tokens";
      return std::nullopt;
    }
    std::vector<int> c_roles(cs.size(), -100);
    c_roles[static_cast<size_t>(ccon[0])] = kExpert;
    for (int i = 0; i < rank; ++i) {
      int role = roles.at(static_cast<size_t>(ybatch[i]));
      if (role != i) {  // batch dims in token order, so the result is [..., E2]
        why = "the combine's batch dims are not the tokens in order";
        return std::nullopt;
      }
      c_roles[static_cast<size_t>(cbatch[i])] = i;
    }
    auto out_shape = m.gate.lead;
    out_shape.push_back(m.n);
    if (g.shape(node_ref(comb)) != out_shape || yside != 0) {
      why = "the combine's result is not [..., E2]";
      return std::nullopt;
    }
    m.combine = comb;
    m.weights = cv;
    m.c_roles = c_roles;
    // k: the routing's top_k, when it has one
    std::vector<int> tops;
    std::vector<char> seen(g.size(), 0);
    std::vector<value_ref> stack{cv};
    while (!stack.empty()) {
      auto v = stack.back();
      stack.pop_back();
      if (!v.is_node() || seen[v.id])
        continue;
      seen[v.id] = 1;
      if (g.primitive(v.id) == "top_k")
        tops.push_back(v.id);
      for (unsigned k = 0; k < g.operand_count(v.id); ++k)
        stack.push_back(g.operand(v.id, k));
    }
    m.top_k = static_cast<int>(m.gate.experts);
    if (tops.size() == 1) {
      int k = g.params(tops[0]).value("k", 0);
      if (k > 0 && k < m.top_k)
        m.top_k = k;
    }
    return m;
  }
  why = "no per-expert gated MLP";
  return std::nullopt;
}

int64_t call_vmem(int64_t m, int64_t k, int64_t n, int nw, int64_t xb, int64_t wb, int64_t ob,
                  int64_t bm, int64_t bk, int64_t bn) {
  int64_t ebm = effective_block(m, 8 * std::max<int64_t>(1, 4 / xb), bm);
  int64_t ebk = effective_block(k, 128, bk);
  int64_t ebn = effective_block(n, 128, bn);
  return 2 * ebm * ebk * xb + nw * 2 * ebk * ebn * wb + 2 * ebm * ebn * ob + nw * ebm * ebn * 4;
}

class moe_ffn_template final : public kernel_template {
public:
  std::string name() const override { return "moe_ffn"; }
  std::string covers() const override {
    return "mixture-of-experts feed-forward blocks written densely (every expert on every "
           "token, zero combine weights): routing replayed, routed rows only through grouped "
           "matmuls";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    std::string why;
    auto found = find_moe(g, why);
    if (!found)
      return std::nullopt;
    auto& mf = *found;
    auto args = make_workload_args(spec);
    if (args.graph_inputs.size() != g.input_count())
      return std::nullopt;
    dim_symbols dims(g, args.graph_inputs);
    dims.set_size_names(args.dim_names, args.reduced_by_value);
    auto value_expr = [&](const value_ref& v) {
      return v.is_input() ? args.graph_inputs[v.id] : fmt::format("v{}", v.id);
    };
    const auto& x = mf.gate.x;
    const auto& lead = mf.gate.lead;
    auto f_expr = dims.dim_expr(mf.gate.w, mf.gate.transposed ? 1 : 2);
    auto e_expr = dims.dim_expr(x, static_cast<int>(lead.size()));
    if (f_expr.empty() || e_expr.empty())
      return std::nullopt;
    // The glu on the sorted rows: seeds are the two all-experts products.
    epilogue_request gr;
    gr.space.resize(2);
    auto rows = lead;
    rows.push_back(mf.gate.experts);
    for (size_t a = 0; a < rows.size(); ++a) {
      gr.space[0].factors.push_back(rows[a]);
      gr.space[0].factor_exprs.push_back(
          a < lead.size() ? dims.dim_expr(x, static_cast<int>(a)) : dims.dim_expr(mf.gate.w, 0));
    }
    gr.space[1].factors = {mf.gate.f};
    gr.space[1].factor_exprs = {f_expr};
    auto seed_shape = rows;
    seed_shape.push_back(mf.gate.f);
    for (const auto* p : {&mf.gate, &mf.up}) {
      block_seed s;
      s.value = node_ref(p->dot);
      if (!map_dims_to_factors(seed_shape, gr.space, s.dims))
        return std::nullopt;
      gr.seeds.push_back(s);
    }
    gr.ends = {mf.h};
    gr.name = "_glu";
    std::string notes;
    auto glu = build_fused_epilogue(g, dims, gr, notes);
    if (glu.end != mf.h || !glu.extras.empty())
      return std::nullopt;  // the glu must run whole on blocks, with no operands
    // C as [T, X]: token dims in order, then the experts.
    std::vector<int> perm(mf.c_roles.size());
    for (size_t a = 0; a < mf.c_roles.size(); ++a) {
      int role = mf.c_roles[a];
      perm[role == kExpert ? lead.size() : static_cast<size_t>(role)] = static_cast<int>(a);
    }
    std::string perm_s;
    for (auto a : perm)
      perm_s += std::to_string(a) + ", ";
    std::string call = fmt::format(
        "y0 = _moe({x}.reshape(-1, {e}), lax.transpose({c}, ({perm})).reshape("
        "-1, {xx}).astype(jnp.float32), k={k}, gate=({wg}, {tg}, 0), up=({wu}, {tu}, 0), "
        "down=({wd}, {td}), f={f}, h_dtype={hd}, y_dtype={yd}).reshape({x}.shape[:-1] + "
        "({n},))",
        fmt::arg("x", value_expr(x)), fmt::arg("e", e_expr), fmt::arg("c", value_expr(mf.weights)),
        fmt::arg("perm", perm_s), fmt::arg("xx", dims.dim_expr(mf.gate.w, 0)),
        fmt::arg("k", mf.top_k), fmt::arg("wg", value_expr(mf.gate.w)),
        fmt::arg("tg", mf.gate.transposed ? "True" : "False"), fmt::arg("wu", value_expr(mf.up.w)),
        fmt::arg("tu", mf.up.transposed ? "True" : "False"), fmt::arg("wd", value_expr(mf.wd)),
        fmt::arg("td", mf.td ? "True" : "False"), fmt::arg("f", f_expr),
        fmt::arg("hd", py_dtype(g.dtype(node_ref(mf.h)))),
        fmt::arg("yd", py_dtype(g.dtype(node_ref(g.consumers(mf.h)[0])))),
        fmt::arg("n", dims.dim_expr(mf.wd, mf.td ? 1 : 2)));
    replay_request req;
    req.inputs = args.graph_inputs;
    req.outputs = graph_outputs(g);
    for (auto v : {x, mf.weights, mf.gate.w, mf.up.w, mf.wd})
      if (v.is_node())
        req.outputs.push_back(v);
    req.given[mf.combine] = "y0";
    req.statements[mf.combine] = call;
    replay_code body;
    if (!build_replay(g, dims, req, body, why))
      return std::nullopt;
    double total = g.raw().getFlops();
    if (body.flops > 0.1 * total)
      return std::nullopt;
    size_t n_out = g.output_count();
    std::string result;
    for (size_t k = 0; k < n_out; ++k)
      result += (k ? ", " : "") + body.outputs[k];
    if (n_out != 1)
      result = "(" + result + ")";
    int64_t tokens = 1;
    for (auto d : lead)
      tokens *= d;
    double atol = 1;
    for (auto tol : spec.getTolerances())
      if (tol.getAtol() > 0)
        atol = std::min(atol, tol.getAtol());
    template_match t;
    t.family = name();
    t.summary = fmt::format("dense MoE: {} tokens x {} experts (top {}), gated MLP {} -> {} -> {}; "
                            "glu {}; routing replayed ({})",
                            tokens, mf.gate.experts, mf.top_k, mf.gate.e, mf.gate.f, mf.n, glu.how,
                            [&] {
                              std::string s;
                              for (const auto& p : body.primitives)
                                s += (s.empty() ? "" : " ") + p;
                              return s;
                            }());
    t.score = 1.3;
    t.facts = {{"tokens", tokens}, {"rows", tokens * mf.top_k}, {"experts", mf.gate.experts},
               {"top_k", mf.top_k}, {"e", mf.gate.e}, {"f", mf.gate.f}, {"n", mf.n},
               {"x_dtype", g.dtype(x)}, {"w_dtype", g.dtype(mf.gate.w)},
               {"h_dtype", g.dtype(node_ref(mf.h))},
               {"test_block_cap", dtype_bytes(g.dtype(x)) < 4 && atol < 4e-3 ? 512 : 0},
               {"signature", args.signature()},
               {"graph_inputs", [&] {
                  std::string s;
                  for (const auto& a : args.graph_inputs)
                    s += (s.empty() ? "" : ", ") + a;
                  return s;
                }()},
               {"glu", glu.code},
               {"body", body.code(4) + "    return " + result + "\n"},
               {"notes", notes}};
    return t;
  }

  nlohmann::json initial_params(const template_match& m, const config::chip& chip) const override {
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes * 3 / 4);
    int64_t cap = m.facts.value("test_block_cap", int64_t{0});
    nlohmann::json p;
    // the largest blocks that fit (the grouped kernels re-read each expert's weights once per
    // row tile that expert's rows span, so rows first), within the test cap
    for (int64_t bm : {1024, 512, 256, 128})
      for (int64_t bk : {1024, 512, 256})
        for (int64_t bn : {1024, 512, 256}) {
          if (cap > 0 && (bk > cap || bn > cap))
            continue;
          nlohmann::json q = {{"block_m", bm}, {"block_k", bk}, {"block_n", bn},
                              {"n_semantics", "parallel"},
                              {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
          if (p.is_null() && vmem_bytes(m, q) <= budget)
            p = q;
        }
    if (p.is_null())
      p = {{"block_m", 128}, {"block_k", 256}, {"block_n", 256}, {"n_semantics", "parallel"},
           {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
    return p;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    int64_t rows = m.facts["rows"], e = m.facts["e"], f = m.facts["f"];
    return {
        {"block_m", tunable::kind::block, rows, sublane_align(m.facts["x_dtype"]), 1, 0, false,
         {}, "routed rows per tile (both grouped kernels)"},
        {"block_k", tunable::kind::block, std::min(e, f), 128, 2, 0, true, {},
         "contraction per step (E for gate/up, F for down)"},
        {"block_n", tunable::kind::block, std::min(e, f), 128, 0, 0, false, {},
         "output columns per tile (F for gate/up, E for down)"},
        {"n_semantics", tunable::kind::choice, 0, 1, 0, 0, false, {"parallel", "arbitrary"},
         "column blocks split across TensorCores or not"},
        {"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false,
         {16 << 20, 32 << 20, 64 << 20, 100 << 20}, "scoped VMEM limit"},
    };
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& p) const override {
    int64_t rows = m.facts["rows"], e = m.facts["e"], f = m.facts["f"], n = m.facts["n"];
    auto xb = dtype_bytes(m.facts["x_dtype"]), wb = dtype_bytes(m.facts["w_dtype"]);
    auto hb = dtype_bytes(m.facts["h_dtype"]);
    int64_t bm = p.value("block_m", 512), bk = p.value("block_k", 512), bn = p.value("block_n", 512);
    return std::max(call_vmem(rows, e, f, 2, xb, wb, hb, bm, bk, bn),
                    call_vmem(rows, f, n, 1, hb, wb, hb, bm, bk, bn));
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    for (const char* key : {"block_m", "block_k", "block_n", "vmem_limit_bytes"})
      if (!params.contains(key) || !params[key].is_number_integer() || params[key].get<int64_t>() <= 0) {
        error = fmt::format("moe_ffn: parameter {} must be a positive integer", key);
        return false;
      }
    std::string sem = params.value("n_semantics", "parallel");
    if (sem != "parallel" && sem != "arbitrary") {
      error = "moe_ffn: n_semantics must be \"parallel\" or \"arbitrary\"";
      return false;
    }
    auto it = embedded_templates().find("gmm_core.py");
    if (it == embedded_templates().end()) {
      error = "moe_ffn: gmm_core.py is not embedded";
      return false;
    }
    return fill_template(
        "moe_ffn.py",
        {{"summary", m.summary},
         {"params", params.dump()},
         {"block_m", std::to_string(params["block_m"].get<int64_t>())},
         {"block_k", std::to_string(params["block_k"].get<int64_t>())},
         {"block_n", std::to_string(params["block_n"].get<int64_t>())},
         {"n_semantics", sem},
         {"vmem_limit_bytes", std::to_string(params["vmem_limit_bytes"].get<int64_t>())},
         {"gmm_core", it->second},
         {"replay_prelude", replay_prelude()},
         {"glu", m.facts["glu"].get<std::string>()},
         {"graph_inputs", m.facts["graph_inputs"].get<std::string>()},
         {"signature", m.facts["signature"].get<std::string>()},
         {"body", m.facts["body"].get<std::string>()}},
        source, error);
  }
};

}  // namespace

template_ptr make_moe_ffn_template() { return std::make_shared<moe_ffn_template>(); }

}  // namespace maxkernel::agents::expert
