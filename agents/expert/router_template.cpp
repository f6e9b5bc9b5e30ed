// Template router: a mixture-of-experts router, the reference's whole computation being
// logits = x @ W (one 2-D matmul, x [rows, H], W [H, E] or [E, H]), a row-wise scoring of
// the logits (softmax, sigmoid, a bias, a scale: any chain block_program can generate on
// [rows, E] blocks), lax.top_k of the scores over the experts, and small work on the k
// values and indices (renormalisation, casts). One Pallas kernel per block of rows: the
// logits accumulate in f32 VMEM scratch over blocks of H (the [rows, E] logits never go to
// HBM), the scores are computed in VMEM, the top k are picked as the topk template does (k
// rounds of row max + lowest column + mask), and the [rows, k] work after the top_k runs in
// the kernel's store when it is row-local (else replayed as jnp after the kernel).
// Refused: several top_k or matmuls, a top_k of something other than the matmul's scores,
// the logits or scores read by anything else (an auxiliary load-balancing loss needs the
// full scores: the rowwise / matmul templates' business), loops.
#include "agents/expert/block_program.hpp"
#include "agents/expert/block_size.hpp"
#include "agents/expert/index_replay.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_signature.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace maxkernel::agents::expert {

namespace {

using json = nlohmann::json;

value_ref input_ref(int k) { return value_ref{value_ref::kind::input, k, ""}; }
value_ref node_ref(int id) { return value_ref{value_ref::kind::node, id, ""}; }

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

int64_t sublane(const std::string& dtype) {
  int b = dtype_bytes(dtype);
  return b >= 4 ? 8 : 8 * (4 / b);
}

// Every node the value v depends on (v's own node included), not looking behind `stop`.
std::set<int> ancestors(const graph_view& g, value_ref v, int stop = -1) {
  std::set<int> seen;
  std::vector<int> todo;
  if (v.is_node())
    todo.push_back(v.id);
  while (!todo.empty()) {
    int n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second || n == stop)
      continue;
    for (unsigned j = 0; j < g.operand_count(n); ++j)
      if (auto o = g.operand(n, j); o.is_node())
        todo.push_back(o.id);
  }
  return seen;
}

class router_template final : public kernel_template {
public:
  std::string name() const override { return "router"; }
  std::string covers() const override {
    return "mixture-of-experts router: logits x @ W, row-wise scores (softmax, sigmoid, bias), "
           "top-k experts and their renormalised weights in one kernel per block of rows";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    auto tops = g.find("top_k");
    auto dots = g.find("dot_general");
    if (tops.size() != 1 || dots.size() != 1)
      return std::nullopt;
    for (unsigned i = 0; i < g.size(); ++i)
      if (g.in_loop(static_cast<int>(i)))
        return std::nullopt;
    int top = tops[0], dot = dots[0];
    value_ref scores = g.operand(top, 0);
    auto ss = g.shape(scores);
    int k = g.params(top).value("k", 0);
    int axis = g.params(top).value("axis", static_cast<int>(ss.size()) - 1);
    if (ss.size() != 2 || axis != 1 || k < 1 || k > ss[1] || !is_float_dtype(g.dtype(scores)))
      return std::nullopt;
    auto before = ancestors(g, scores);
    if (!before.count(dot))
      return std::nullopt;

    // The matmul: rows of x against the experts' columns of W, one contracting dim each.
    const auto& p = g.params(dot);
    auto lc = p.value("lhs_contracting", std::vector<int>{});
    auto rc = p.value("rhs_contracting", std::vector<int>{});
    auto lb = p.value("lhs_batch", std::vector<int>{});
    if (lc.size() != 1 || rc.size() != 1 || !lb.empty())
      return std::nullopt;
    auto lt = trace_operand(g, g.operand(dot, 0));
    auto rt = trace_operand(g, g.operand(dot, 1));
    if (!lt.source.is_input() || !rt.source.is_input() || lt.source.id == rt.source.id)
      return std::nullopt;
    auto ls = g.shape(g.operand(dot, 0)), rs = g.shape(g.operand(dot, 1));
    if (ls.size() != 2 || rs.size() != 2 || g.shape(lt.source) .size() != 2 ||
        g.shape(rt.source).size() != 2)
      return std::nullopt;
    // Where the operand's contracting dim sits in its source input (through transposes).
    int xk = lt.dims.size() == 2 ? lt.dims[static_cast<size_t>(lc[0])] : -1;
    int wk = rt.dims.size() == 2 ? rt.dims[static_cast<size_t>(rc[0])] : -1;
    if (xk < 0 || wk < 0)
      return std::nullopt;
    int x = lt.source.id, w = rt.source.id;
    auto xs = g.shape(input_ref(x)), wsh = g.shape(input_ref(w));
    std::string x_layout = xk == 1 ? "mk" : "km";
    std::string w_layout = wk == 0 ? "kn" : "nk";
    int64_t rows = xs[xk == 1 ? 0 : 1], hidden = xs[static_cast<size_t>(xk)];
    int64_t experts = wsh[wk == 0 ? 1 : 0];
    auto ds = g.shape(node_ref(dot));
    if (ds != std::vector<int64_t>{rows, experts} || ss != ds)
      return std::nullopt;
    // x and W are read by the matmul only (casts and transposes on the way are fine).
    auto lchain = ancestors(g, g.operand(dot, 0)), rchain = ancestors(g, g.operand(dot, 1));
    for (unsigned i = 0; i < g.size(); ++i) {
      int id = static_cast<int>(i);
      for (unsigned j = 0; j < g.operand_count(id); ++j) {
        auto o = g.operand(id, j);
        bool reads = o.is_input() && (o.id == x || o.id == w);
        if (reads && id != dot && !lchain.count(id) && !rchain.count(id))
          return std::nullopt;
      }
    }
    for (unsigned o = 0; o < g.output_count(); ++o)
      if (auto v = g.output(o); v.is_input() && (v.id == x || v.id == w))
        return std::nullopt;
    // Between the logits and the scores: a row-wise program on [rows, E] blocks.
    auto sig = make_signature(spec);
    if (sig.graph_inputs.size() != g.input_count())
      return std::nullopt;
    std::string xname = sig.input(x), wname = sig.input(w);
    std::vector<space_axis> space(2);
    space[0].factors = {rows};
    space[0].factor_exprs = {fmt::format("{}.shape[{}]", xname, xk == 1 ? 0 : 1)};
    space[1].factors = {experts};
    space[1].factor_exprs = {fmt::format("{}.shape[{}]", wname, wk == 0 ? 1 : 0)};
    block_request req;
    req.space = space;
    req.name = "_scores";
    block_seed seed;
    seed.value = node_ref(dot);
    if (!map_dims_to_factors(ds, space, seed.dims))
      return std::nullopt;
    req.seeds.push_back(seed);
    req.outputs.push_back(scores);
    block_program prog;
    std::string why;
    if (scores.is_node() && scores.id == dot) {
      prog.code = "def _scores(seeds, extras, offsets, extents):\n    return [seeds[0]]\n";
      prog.reduced = {false, false};
    } else if (!build_block_program(g, req, prog, why) || prog.reduced[0]) {
      return std::nullopt;
    }
    // The logits and scores feed the top_k only.
    for (int n : before)
      for (int c : g.consumers(n))
        if (c != top && !before.count(c))
          return std::nullopt;
    for (unsigned o = 0; o < g.output_count(); ++o)
      if (auto v = g.output(o); v.is_node() && before.count(v.id))
        return std::nullopt;

    // After the top_k: replayed from the graph on the [rows, k] results.
    graph_facts::replay_sources sources;
    for (unsigned i = 0; i < g.input_count(); ++i)
      if (static_cast<int>(i) != x && static_cast<int>(i) != w)
        sources.inputs[static_cast<int>(i)] = sig.input(static_cast<int>(i));
    sources.results[{top, 0}] = "top_values";
    sources.results[{top, 1}] = "top_indices";
    std::vector<int> wanted;
    std::vector<std::string> returns;
    json outputs = json::array();
    bool in_kernel = true;  // every output a [rows, n] value of the top_k's results only
    auto out_results = g.raw().getOutputResults();
    for (unsigned o = 0; o < g.output_count(); ++o) {
      auto v = g.output(o);
      if (v.is_input()) {
        returns.push_back(sig.input(v.id));
        in_kernel = false;
        continue;
      }
      if (!v.is_node())
        return std::nullopt;
      std::string expr;
      if (v.id == top) {
        int r = o < out_results.size() ? out_results[o] : 0;
        expr = r == 0 ? "top_values" : "top_indices";
        v.result = r;
      } else {
        wanted.push_back(v.id);
        expr = "t" + std::to_string(v.id);
      }
      auto shape = v.id == top ? std::vector<int64_t>{rows, k} : g.shape(v);
      std::string dt = v.id == top ? g.node(top).getResults()[v.result].getDtype().cStr()
                                   : g.dtype(v);
      if (shape.size() != 2 || shape[0] != rows || dt == "bool")
        in_kernel = false;
      outputs.push_back({expr, shape.size() == 2 ? shape[1] : 0, dt});
      returns.push_back(expr);
    }
    // In the kernel the rows are a block's: the replayed code may read the top_k's results
    // only (no other input), and no other size may be spelled like the rows.
    for (int id : wanted)
      for (int n : ancestors(g, node_ref(id), top))
        for (unsigned j = 0; j < g.operand_count(n); ++j)
          if (g.operand(n, j).is_input())
            in_kernel = false;
    if (rows == k || rows == experts || rows == 1)
      in_kernel = false;
    std::string outside_code, kernel_code;
    if (!wanted.empty() &&
        !graph_facts::replay_values(g, wanted, {{rows, space[0].factor_exprs[0]}}, sources,
                                    outside_code, why))
      return std::nullopt;
    if (in_kernel && !wanted.empty() &&
        !graph_facts::replay_values(g, wanted, {{rows, "_rows"}}, sources, kernel_code, why))
      in_kernel = false;
    for (const char* bad : {"gather", "scatter", "iota", "sort", "cumsum", "argsort"})
      if (kernel_code.find(bad) != std::string::npos)
        in_kernel = false;
    std::string ret;
    for (size_t i = 0; i < returns.size(); ++i)
      ret += (i ? ", " : "") + returns[i];

    std::string prims;
    for (auto& pr : prog.primitives)
      prims += (prims.empty() ? "" : " ") + pr;
    template_match m;
    m.family = name();
    m.summary = fmt::format(
        "router: {} rows x {} hidden (in{}) @ {} experts (in{}), scores [{}], top-{}, {} "
        "output(s), {} op(s) after the top_k",
        rows, hidden, x, experts, w, prims.empty() ? "logits" : prims, k, g.output_count(),
        std::count(outside_code.begin(), outside_code.end(), '\n'));
    json extras = json::array(), extra_dtypes = json::array();
    std::string extra_args;
    for (auto& op : prog.operands) {
      const std::string& nm = sig.input(op.input);
      if (op.present[0])
        return std::nullopt;  // a per-row operand of the scores: not a router's bias
      if (op.scalar) {
        extras.push_back(nullptr);
        extra_dtypes.push_back(is_float_dtype(op.dtype) ? "float32" : "int32");
        extra_args += fmt::format("jnp.reshape(jnp.asarray({}), (1,)).astype(jnp.{}), ", nm,
                                  extra_dtypes.back().get<std::string>());
        continue;
      }
      std::string dt = op.dtype == "bool" ? "int32" : op.dtype;
      extras.push_back(op.present[1]);
      extra_dtypes.push_back(dt);
      extra_args += fmt::format("jnp.reshape({}, {}){}, ", nm, op.space_shape,
                                op.dtype == "bool" ? ".astype(jnp.int32)" : "");
    }
    json config = {{"x_layout", x_layout},
                   {"x_cast", g.dtype(g.operand(dot, 0))},
                   {"w_cast", g.dtype(g.operand(dot, 1))},
                   {"scale", lt.scale * rt.scale},
                   {"w_layout", w_layout},
                   {"score_dtype", g.dtype(scores)},
                   {"value_dtype", g.node(top).getResults()[0].getDtype().cStr()},
                   {"extras", extras},
                   {"outputs", outputs},
                   {"transcendentals", prog.transcendentals}};
    m.facts = {{"x", x}, {"w", w}, {"k", k}, {"rows", rows}, {"hidden", hidden},
               {"experts", experts}, {"x_dtype", g.dtype(input_ref(x))},
               {"w_dtype", g.dtype(input_ref(w))}, {"config", config},
               {"program", prog.code}, {"extra_args", extra_args},
               {"in_kernel", in_kernel}, {"outside_code", outside_code},
               {"kernel_code", kernel_code}, {"returns", ret},
               {"signature", signature_facts(sig)}};
    m.score = 1.0;
    return m;
  }

  struct blocks {
    int64_t br, bk;
  };
  // Alignment of (block_rows, block_k): the rows sit on x's sublanes (mk) or lanes (km); the
  // hidden dim on lanes when x is mk or W is nk, else on both operands' sublanes.
  static std::pair<int64_t, int64_t> aligns(const template_match& m) {
    bool mk = m.facts["config"]["x_layout"] == "mk", kn = m.facts["config"]["w_layout"] == "kn";
    int64_t ra = mk ? sublane(m.facts["x_dtype"]) : 128;
    int64_t ka = mk || !kn ? 128 : std::max(sublane(m.facts["x_dtype"]), sublane(m.facts["w_dtype"]));
    return {ra, ka};
  }
  blocks effective(const template_match& m, const json& params) const {
    auto get = [&](const char* key, int64_t d) {
      return params.contains(key) && params[key].is_number_integer() ? params[key].get<int64_t>()
                                                                     : d;
    };
    auto [ra, ka] = aligns(m);
    return {effective_block(m.facts["rows"], ra, get("block_rows", 256)),
            effective_block(m.facts["hidden"], ka, get("block_k", 2048))};
  }

  int64_t vmem_bytes(const template_match& m, const json& params) const override {
    auto b = effective(m, params);
    int64_t e = m.facts["experts"];
    int64_t lanes_e = round_up(e, 128);
    int64_t xb = dtype_bytes(m.facts["x_dtype"]), wb = dtype_bytes(m.facts["w_dtype"]);
    int64_t in = 2 * round_up(b.br, 8) * round_up(b.bk, 128) * xb +
                 2 * round_up(b.bk, 8) * lanes_e * wb;
    int64_t acc = round_up(b.br, 8) * lanes_e * 4;
    int64_t work = 4 * round_up(b.br, 8) * std::max<int64_t>(lanes_e, 128) * 4;
    int64_t outs = 2 * static_cast<int64_t>(m.facts["config"]["outputs"].size()) *
                   round_up(b.br, 8) * 128 * 4;
    return in + acc + work + outs;
  }

  json initial_params(const template_match& m, const config::chip& chip) const override {
    json p = {{"block_rows", 256},
              {"block_k", static_cast<int64_t>(m.facts["hidden"])},
              {"unroll", 1},
              {"epilogue", m.facts["in_kernel"].get<bool>() ? "kernel" : "outside"},
              {"dimension_semantics", "parallel"},
              {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
    // The whole hidden dim in one step when it fits: with blocks of it, W's blocks change
    // along the hidden axis and W is read again for every row block (and the sum differs from
    // the reference's, so may its ties among the scores). Then rows: 256 a block balances the
    // per-step overhead (~0.35 us) against the first block's exposed copy (modeled v6e:
    // 128 / 256 / 512 rows within 1% of each other on Mixtral and DeepSeek-V3 prefill).
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes) * 3 / 4;
    int64_t h = m.facts["hidden"];
    const std::vector<std::pair<int64_t, int64_t>> order = {
        {256, h},     {512, h},     {128, h},    {64, h},    {32, h},   {8, h},
        {256, 2048},  {128, 1024},  {64, 512},   {8, 256}};
    for (auto [br, bk] : order) {
      p["block_rows"] = br;
      p["block_k"] = std::min(bk, h);
      if (vmem_bytes(m, p) <= budget)
        break;
    }
    if (auto need = vmem_bytes(m, p); need > budget)
      p["vmem_limit_bytes"] = std::min<int64_t>(static_cast<int64_t>(chip.vmem_bytes) * 7 / 8,
                                                round_up(need * 4 / 3, 1 << 20));
    return p;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    auto [ra, ka] = aligns(m);
    std::vector<tunable> ts = {
        {"block_rows", tunable::kind::block, m.facts["rows"], ra, 0, 0, false, {},
         "token rows per block (their logits and scores held whole in VMEM)"},
        {"block_k", tunable::kind::block, m.facts["hidden"], ka, 1, 0, true, {},
         "hidden elements per step (logits accumulated in f32 VMEM scratch)"},
        {"unroll", tunable::kind::choice, 0, 1, -1, 0, false, {1, 2}, "unrolling of the k rounds"},
        {"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
         {"parallel", "arbitrary"}, "row blocks split across TensorCores"},
        {"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {}, "scoped VMEM limit"},
    };
    if (m.facts["in_kernel"].get<bool>())
      ts.push_back({"epilogue", tunable::kind::choice, 0, 1, -1, 0, false, {"kernel", "outside"},
                    "the work after the top_k in the kernel's store or as jnp after it"});
    return ts;
  }

  bool render(const template_match& m, const json& params, std::string& source,
              std::string& error) const override {
    for (const char* key : {"block_rows", "block_k", "unroll"})
      if (!params.contains(key) || !params[key].is_number_integer() ||
          params[key].get<int64_t>() < 1) {
        error = std::string("param ") + key + " must be a positive integer";
        return false;
      }
    auto sem = params.value("dimension_semantics", std::string());
    if (sem != "parallel" && sem != "arbitrary") {
      error = "param dimension_semantics must be parallel or arbitrary";
      return false;
    }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number() ||
        params["vmem_limit_bytes"].get<double>() <= 0) {
      error = "param vmem_limit_bytes must be a positive number";
      return false;
    }
    auto epi = params.value("epilogue", std::string("outside"));
    if (epi != "kernel" && epi != "outside") {
      error = "param epilogue must be kernel or outside";
      return false;
    }
    if (epi == "kernel" && !m.facts["in_kernel"].get<bool>()) {
      error = "param epilogue: the work after the top_k is not row-local, only outside";
      return false;
    }
    const auto& sig = m.facts["signature"];
    auto arg = [&](const char* key) {
      int i = m.facts[key];
      return sig["names"][sig["graph_inputs"][static_cast<size_t>(i)].get<size_t>()]
          .get<std::string>();
    };
    json cfg = m.facts["config"];
    cfg["epilogue"] = epi;
    std::string kernel_code = m.facts["kernel_code"], outside_code = m.facts["outside_code"];
    std::string kernel_returns;
    for (const auto& o : cfg["outputs"])
      kernel_returns += (kernel_returns.empty() ? "" : ", ") + o[0].get<std::string>();
    return fill_template(
        "router.py",
        {{"header", header_comment(name(), m.summary, params.dump())},
         {"params", python_literal(params)},
         {"config", python_literal(cfg)},
         {"k", std::to_string(m.facts["k"].get<int>())},
         {"program", m.facts["program"].get<std::string>()},
         {"args", sig["args"].get<std::string>()},
         {"x", arg("x")},
         {"w", arg("w")},
         {"extras", m.facts["extra_args"].get<std::string>()},
         {"kernel_epilogue",
          epi == "kernel" && !kernel_code.empty() ? "    " + indent(kernel_code, 4) : "    pass"},
         {"kernel_returns", epi == "kernel" ? kernel_returns : "top_values, top_indices"},
         {"outside_epilogue", epi == "outside" && !outside_code.empty()
                                  ? "    " + indent(outside_code, 4)
                                  : "    pass"},
         {"returns", m.facts["returns"].get<std::string>()}},
        source, error);
  }
};

}  // namespace

template_ptr make_router_template() { return std::make_shared<router_template>(); }

}  // namespace maxkernel::agents::expert
