// Template einsum_core: references whose work is dominated by one contraction of COMPUTED
// operands (a batched einsum such as AlphaFold's triangle multiplication, x_ij = sum_k
// a_ik b_jk per channel, between gated projections and layer norms): the contraction
// becomes a Pallas batched matmul (batch, rows, cols, K grid), the ops before and after it
// are replayed from the graph as jnp for XLA to fuse around the kernel. A fallback of low
// score: specialised templates (attention, matmul epilogues, MoE) win when they match. Also
// the fallback for contractions the matmul family refuses: batch dims that do not lead
// ([M, K, B] x [K, N, B]), an operand computed before the product (x @ (w_q * scale).T).
// Refused: a contraction of graph inputs alone without batch dims (the matmul family's),
// one that is not at least 60% of the reference's matmul flops, loops, primitives the
// replay does not know.
#include "agents/expert/block_size.hpp"
#include "agents/expert/index_replay.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_signature.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace maxkernel::agents::expert {

namespace {

std::string perm_text(const std::vector<int>& p) {
  std::string t = "(";
  for (int x : p)
    t += std::to_string(x) + ", ";
  return t + ")";
}

class einsum_core_template final : public kernel_template {
public:
  std::string name() const override { return "einsum_core"; }
  std::string covers() const override {
    return "a dominant batched contraction of computed operands (triangle multiplication) "
           "in Pallas, with the ops around it replayed for XLA";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    for (unsigned i = 0; i < g.size(); ++i)
      if (g.in_loop(static_cast<int>(i)))
        return std::nullopt;
    int core = -1;
    double total = 0, best = 0;
    for (int d : g.find("dot_general")) {
      double f = g.node(d).getFlops();
      total += f;
      if (f > best) {
        best = f;
        core = d;
      }
    }
    if (core < 0 || best < 0.6 * total)
      return std::nullopt;
    const auto& p = g.params(core);
    auto lc = p.value("lhs_contracting", std::vector<int>{});
    auto rc = p.value("rhs_contracting", std::vector<int>{});
    auto lb = p.value("lhs_batch", std::vector<int>{});
    auto rb = p.value("rhs_batch", std::vector<int>{});
    auto lhs = g.operand(core, 0), rhs = g.operand(core, 1);
    bool lhs_computed = !trace_operand(g, lhs).source.is_input();
    bool rhs_computed = !trace_operand(g, rhs).source.is_input();
    // Graph inputs on both sides without batch dims are the matmul family's; with batch dims
    // anywhere ([M, K, B] x [K, N, B]) or a computed side (a weight dequantised by a
    // per-channel scale before the product), the operands are permuted / computed in the
    // wrapper and the contraction runs here.
    if (lc.empty() || (!lhs_computed && !rhs_computed && lb.empty()))
      return std::nullopt;
    auto ls = g.shape(lhs), rs = g.shape(rhs);
    auto free_of = [](size_t rank, const std::vector<int>& b, const std::vector<int>& c) {
      std::vector<int> f;
      for (int d = 0; d < static_cast<int>(rank); ++d)
        if (std::find(b.begin(), b.end(), d) == b.end() && std::find(c.begin(), c.end(), d) == c.end())
          f.push_back(d);
      return f;
    };
    auto lf = free_of(ls.size(), lb, lc), rf = free_of(rs.size(), rb, rc);
    std::vector<int> lperm = lb, rperm = rb;
    lperm.insert(lperm.end(), lf.begin(), lf.end());
    lperm.insert(lperm.end(), lc.begin(), lc.end());
    rperm.insert(rperm.end(), rf.begin(), rf.end());
    rperm.insert(rperm.end(), rc.begin(), rc.end());
    int64_t nb = 1, m = 1, n = 1, k = 1;
    for (int d : lb)
      nb *= ls[static_cast<size_t>(d)];
    for (int d : lf)
      m *= ls[static_cast<size_t>(d)];
    for (int d : rf)
      n *= rs[static_cast<size_t>(d)];
    for (int d : lc)
      k *= ls[static_cast<size_t>(d)];
    // Replays: the operands from the inputs; the outputs from the inputs and the kernel.
    auto sig = make_signature(spec);
    graph_facts::replay_sources src;
    std::map<int64_t, std::string> sizes;
    for (unsigned i = 0; i < g.input_count(); ++i) {
      src.inputs[static_cast<int>(i)] = sig.input(static_cast<int>(i));
      auto sh = g.shape(value_ref{value_ref::kind::input, static_cast<int>(i), ""});
      for (size_t d = 0; d < sh.size(); ++d)
        sizes.emplace(sh[d], fmt::format("{}.shape[{}]", sig.input(static_cast<int>(i)), d));
    }
    std::string prologue, epilogue, why;
    std::vector<int> operand_nodes;
    std::string lhs_expr, rhs_expr;
    for (auto [v, expr] : {std::pair{lhs, &lhs_expr}, std::pair{rhs, &rhs_expr}}) {
      if (v.is_node()) {
        operand_nodes.push_back(v.id);
        *expr = "t" + std::to_string(v.id);
      } else {
        *expr = graph_facts::replayed(g, v, src);
        if (expr->empty())
          return std::nullopt;
      }
    }
    if (!operand_nodes.empty() && !graph_facts::replay_values(g, operand_nodes, sizes, src, prologue, why))
      return std::nullopt;
    src.results[{core, 0}] = "core";
    std::vector<int> wanted;
    std::string returns;
    for (unsigned o = 0; o < g.output_count(); ++o) {
      auto v = g.output(o);
      std::string e = v.is_node() && v.id != core ? "t" + std::to_string(v.id) : graph_facts::replayed(g, v, src);
      if (e.empty())
        return std::nullopt;
      if (v.is_node() && v.id != core)
        wanted.push_back(v.id);
      returns += (o ? ", " : "") + e;
    }
    if (!wanted.empty() && !graph_facts::replay_values(g, wanted, sizes, src, epilogue, why))
      return std::nullopt;
    template_match mt;
    mt.family = name();
    mt.summary = fmt::format("contraction {} of {:.0f}% of the matmul flops: batch {}, {}x{}x{}; "
                             "{} op(s) replayed before, {} after",
                             core, 100.0 * best / std::max(total, 1.0), nb, m, k, n,
                             std::count(prologue.begin(), prologue.end(), '\n'),
                             std::count(epilogue.begin(), epilogue.end(), '\n'));
    mt.facts = {{"core", core}, {"lhs_perm", lperm}, {"rhs_perm", rperm},
                {"num_batch", lb.size()}, {"num_lhs_free", lf.size()}, {"num_rhs_free", rf.size()},
                {"batch", nb}, {"m", m}, {"n", n}, {"k", k},
                {"in_dtype", g.dtype(lhs)}, {"out_dtype", g.dtype(value_ref{value_ref::kind::node, core, ""})},
                {"lhs", lhs_expr}, {"rhs", rhs_expr}, {"prologue", prologue}, {"epilogue", epilogue},
                {"returns", returns}, {"signature", signature_facts(sig)}};
    mt.score = 0.5;
    return mt;
  }

  nlohmann::json initial_params(const template_match& m,
                                const config::chip& chip) const override {
    int64_t sub = dtype_bytes(m.facts["in_dtype"]) == 2 ? 16 : 8;
    // 128-wide tiles: the tester runs at two blocks per dim, and a cubic contraction at 512
    // per dim over 128 channels did not finish its interpret-mode test within the node's
    // 600 s on 2 cores; the playbook grows them. Several batch entries per step keep the
    // step count low.
    nlohmann::json p = {{"block_m", effective_block(m.facts["m"], sub, 128)},
                        {"block_n", effective_block(m.facts["n"], 128, 128)},
                        {"block_k", effective_block(m.facts["k"], 128, 128)},
                        {"block_b", std::min<int64_t>(m.facts["batch"].get<int64_t>(), 8)},
                        {"dimension_semantics", {"parallel", "parallel", "parallel"}},
                        {"vmem_limit_bytes", chip.scoped_vmem_bytes}};
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes) * 3 / 4;
    for (int guard = 0; guard < 16 && vmem_bytes(m, p) > budget; ++guard) {
      if (p["block_b"].get<int64_t>() > 1) {
        p["block_b"] = p["block_b"].get<int64_t>() / 2;
        continue;
      }
      const char* key = "block_k";
      for (const char* c : {"block_m", "block_n"})
        if (p[c].get<int64_t>() > p[key].get<int64_t>())
          key = c;
      if (p[key].get<int64_t>() <= 128)
        break;
      p[key] = p[key].get<int64_t>() / 2;
    }
    return p;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    int64_t sub = dtype_bytes(m.facts["in_dtype"]) == 2 ? 16 : 8;
    return {
        {"block_b", tunable::kind::block, m.facts["batch"], 1, 0, 0, false, {},
         "batch entries (channels) per step"},
        {"block_m", tunable::kind::block, m.facts["m"], sub, 1, 0, false, {}, "rows per block"},
        {"block_n", tunable::kind::block, m.facts["n"], 128, 2, 0, false, {}, "columns per block"},
        {"block_k", tunable::kind::block, m.facts["k"], 128, 3, 0, true, {},
         "contracted elements per step"},
        {"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
         {nlohmann::json{"parallel", "parallel", "parallel"},
          nlohmann::json{"parallel", "parallel", "arbitrary"}},
         "grid axes split across TensorCores"},
        {"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {}, "scoped VMEM limit"},
    };
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const override {
    int64_t sub = dtype_bytes(m.facts["in_dtype"]) == 2 ? 16 : 8;
    int64_t bm = effective_block(m.facts["m"], sub, params.value("block_m", int64_t{256}));
    int64_t bn = effective_block(m.facts["n"], 128, params.value("block_n", int64_t{256}));
    int64_t bk = effective_block(m.facts["k"], 128, params.value("block_k", int64_t{512}));
    int64_t nb = m.facts["batch"];
    int64_t bb = std::max<int64_t>(1, std::min(nb, params.value("block_b", int64_t{1})));
    while (nb % bb)
      --bb;
    int64_t in = dtype_bytes(m.facts["in_dtype"]);
    return bb * (2 * (bm * bk + bn * bk) * in + 2 * bm * bn * dtype_bytes(m.facts["out_dtype"]) +
                 bm * bn * 4);
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    for (const char* b : {"block_b", "block_m", "block_n", "block_k"})
      if (!params.contains(b) || !params[b].is_number_integer() || params[b].get<int64_t>() < 1) {
        error = std::string("param ") + b + " must be a positive integer";
        return false;
      }
    auto sem = params.value("dimension_semantics", nlohmann::json::array());
    if (!sem.is_array() || sem.size() != 3) {
      error = "param dimension_semantics must be a list of three";
      return false;
    }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number()) {
      error = "param vmem_limit_bytes must be a number";
      return false;
    }
    auto code = [](const std::string& c) { return c.empty() ? std::string("    pass") : "    " + indent(c, 4); };
    const auto& sig = m.facts["signature"];
    return fill_template("einsum_core.py",
                         {{"header", header_comment(name(), m.summary, params.dump())},
                          {"params", python_literal(params)},
                          {"lhs_perm", perm_text(m.facts["lhs_perm"].get<std::vector<int>>())},
                          {"rhs_perm", perm_text(m.facts["rhs_perm"].get<std::vector<int>>())},
                          {"num_batch", std::to_string(m.facts["num_batch"].get<int>())},
                          {"num_lhs_free", std::to_string(m.facts["num_lhs_free"].get<int>())},
                          {"num_rhs_free", std::to_string(m.facts["num_rhs_free"].get<int>())},
                          {"out_dtype", m.facts["out_dtype"].get<std::string>()},
                          {"args", sig["args"].get<std::string>()},
                          {"prologue", code(m.facts["prologue"])},
                          {"lhs", m.facts["lhs"].get<std::string>()},
                          {"rhs", m.facts["rhs"].get<std::string>()},
                          {"epilogue", code(m.facts["epilogue"])},
                          {"returns", m.facts["returns"].get<std::string>()}},
                         source, error);
  }
};

}  // namespace

template_ptr make_einsum_core_template() { return std::make_shared<einsum_core_template>(); }

}  // namespace maxkernel::agents::expert
