// Template attention_backward: dQ, dK, dV of softmax attention (causal or not) from q, k, v
// and the output gradient dO, whatever the spelling of the reference (jax.vjp or jax.grad
// of a plain forward, einsum or dot, scale on q or on the scores, tril or arange masks).
// Recognised from the computation: the forward's softmax attention (softmax_attention_match)
// plus three outputs that are matmuls: one of the probabilities with an input (dO: dV), one
// of a value derived from the probabilities with k (dQ), one with q (dK), and a dO . v
// product (dP) somewhere in between. The kernel recomputes the probabilities from saved
// row statistics (flash-attention backward), never materialising [S, S].
// Refused: other inputs (bias, dropout, lengths), grouped k/v heads (shapes differ), masks
// other than causal, q and k of different lengths, a softmax the forward does not show.
#include "agents/expert/block_size.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/softmax_attention_match.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_signature.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace maxkernel::agents::expert {

namespace {

using namespace graph_facts;

// The input a dot's operands trace to, per side (-1: computed).
std::pair<operand_trace, operand_trace> dot_sides(const graph_view& g, int dot) {
  return {trace_operand(g, g.operand(dot, 0)), trace_operand(g, g.operand(dot, 1))};
}

// True when dot contracts dO and v over the head dim with q's layout on both.
bool is_dp_dot(const graph_view& g, int dot, int d_out, int v, const softmax_attention& a) {
  auto [l, r] = dot_sides(g, dot);
  if (!l.source.is_input() || !r.source.is_input())
    return false;
  if (!((l.source.id == d_out && r.source.id == v) || (l.source.id == v && r.source.id == d_out)))
    return false;
  const auto& p = g.params(dot);
  auto lc = p.value("lhs_contracting", std::vector<int>{});
  auto rc = p.value("rhs_contracting", std::vector<int>{});
  auto lb = p.value("lhs_batch", std::vector<int>{});
  auto rb = p.value("rhs_batch", std::vector<int>{});
  if (lc.size() != 1 || rc.size() != 1 || lb.size() != a.batch_dims.size() || rb.size() != lb.size())
    return false;
  if (l.dims[static_cast<size_t>(lc[0])] != a.head_dim || r.dims[static_cast<size_t>(rc[0])] != a.head_dim)
    return false;
  for (size_t i = 0; i < lb.size(); ++i)
    if (l.dims[static_cast<size_t>(lb[i])] != a.batch_dims[i] ||
        r.dims[static_cast<size_t>(rb[i])] != a.batch_dims[i])
      return false;
  return true;
}

class attention_backward_template final : public kernel_template {
public:
  std::string name() const override { return "attention_backward"; }
  std::string covers() const override {
    return "the backward pass of softmax attention (dQ, dK, dV from q, k, v, dO; causal or "
           "not) as flash-attention backward kernels that recompute the probabilities";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    if (g.output_count() != 3 || g.input_count() != 4)
      return std::nullopt;
    for (const auto& a : find_softmax_attention(g)) {
      if (a.seq_q != a.seq_k)
        continue;
      int q = a.q_input, k = a.k_input;
      int roles[3] = {-1, -1, -1};  // per output: 0 dq, 1 dk, 2 dv
      int d_out = -1;
      bool ok = true;
      for (unsigned o = 0; o < 3 && ok; ++o) {
        auto t = trace_operand(g, g.output(o));
        if (!t.source.is_node() || g.primitive(t.source.id) != "dot_general" ||
            g.in_loop(t.source.id)) {
          ok = false;
          break;
        }
        auto [l, r] = dot_sides(g, t.source.id);
        auto side_is = [&](const operand_trace& s, int input) {
          return s.source.is_input() && s.source.id == input;
        };
        auto derived_from_probs = [&](const operand_trace& s) {
          return s.source.is_node() &&
                 (s.source.id == a.probs || depends_on(g, s.source, a.numerator));
        };
        auto probs_itself = [&](const operand_trace& s) {
          return s.source.is_node() && s.source.id == a.probs;
        };
        if ((probs_itself(l) && r.source.is_input() && r.source.id != q && r.source.id != k) ||
            (probs_itself(r) && l.source.is_input() && l.source.id != q && l.source.id != k)) {
          roles[o] = 2;
          d_out = probs_itself(l) ? r.source.id : l.source.id;
        } else if ((side_is(r, k) && derived_from_probs(l)) || (side_is(l, k) && derived_from_probs(r))) {
          roles[o] = 0;
        } else if ((side_is(r, q) && derived_from_probs(l)) || (side_is(l, q) && derived_from_probs(r))) {
          roles[o] = 1;
        } else {
          ok = false;
        }
      }
      if (!ok || d_out < 0)
        continue;
      std::vector<int> sorted(roles, roles + 3);
      std::sort(sorted.begin(), sorted.end());
      if (sorted != std::vector<int>{0, 1, 2})
        continue;
      int v = -1;
      for (int i = 0; i < 4; ++i)
        if (i != q && i != k && i != d_out)
          v = i;
      // dP = dO . v must be there, in q's layout; every input of q's shape.
      bool dp = false;
      for (int d : g.find("dot_general"))
        dp = dp || is_dp_dot(g, d, d_out, v, a);
      auto qs = g.shape(value_ref{value_ref::kind::input, q, ""});
      bool shapes = true;
      for (int i = 0; i < 4; ++i)
        shapes = shapes && g.shape(value_ref{value_ref::kind::input, i, ""}) == qs;
      for (unsigned o = 0; o < 3; ++o)
        shapes = shapes && g.shape(g.output(o)) == qs;
      if (!dp || !shapes)
        continue;
      std::vector<int> perm = a.batch_dims;
      perm.push_back(a.seq_dim);
      perm.push_back(a.head_dim);
      nlohmann::json out_roles = nlohmann::json::array();
      nlohmann::json out_dtypes = nlohmann::json::array();
      for (unsigned o = 0; o < 3; ++o) {
        out_roles.push_back(roles[o] == 0 ? "dq" : roles[o] == 1 ? "dk" : "dv");
        out_dtypes.push_back(g.dtype(g.output(o)));
      }
      auto tq = trace_operand(g, g.operand(a.scores_dot, 0));
      auto tk = trace_operand(g, g.operand(a.scores_dot, 1));
      std::string mxu = tq.narrowest == tk.narrowest && is_float_dtype(tq.narrowest) ? tq.narrowest
                                                                                      : "float32";
      template_match m;
      m.family = name();
      m.summary = fmt::format("{} softmax attention backward: batch*heads {}, seq {}, head_dim {}, "
                              "scale {:.6g}; inputs q=in{} k=in{} v=in{} dO=in{}",
                              a.causal ? "causal" : "unmasked", a.batch, a.seq_q, a.depth, a.scale,
                              q, k, v, d_out);
      m.facts = {{"q", q}, {"k", k}, {"v", v}, {"do", d_out}, {"perm", perm},
                 {"causal", a.causal}, {"scale", a.scale}, {"seq", a.seq_q},
                 {"depth", a.depth}, {"batch", a.batch}, {"roles", out_roles},
                 {"out_dtypes", out_dtypes}, {"mxu_dtype", mxu},
                 {"in_dtype", g.dtype(value_ref{value_ref::kind::input, q, ""})},
                 {"signature", signature_facts(make_signature(spec))}};
      m.score = 1.0;
      return m;
    }
    return std::nullopt;
  }

  nlohmann::json initial_params(const template_match& m,
                                const config::chip& chip) const override {
    int64_t seq = m.facts["seq"];
    nlohmann::json p = {{"block_q", effective_block(seq, 128, 512)},
                        {"block_k", effective_block(seq, 128, 512)},
                        {"block_b", 1},  // set, so that the search can grow it
                        {"mxu_dtype", m.facts["mxu_dtype"]},
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
    int64_t seq = m.facts["seq"];
    return {
        {"block_q", tunable::kind::block, seq, 128, 1, 0, false, {}, "query rows per block"},
        {"block_k", tunable::kind::block, seq, 128, 2, 0, true, {}, "key rows per block"},
        // Several rows of batch*heads per step: one step's overhead for all of them, VMEM
        // for each (a trade against larger query and key blocks).
        {"block_b", tunable::kind::block, m.facts["batch"].get<int64_t>(), 1, 0, 0, false, {},
         "rows of batch*heads per block"},
        {"mxu_dtype", tunable::kind::choice, 0, 1, -1, 0, false, {"bfloat16", "float32"},
         "dtype of the matmul operands (f32 accumulation either way)"},
        {"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
         {nlohmann::json{"parallel", "parallel"}, nlohmann::json{"parallel", "arbitrary"}},
         "grid axes split across TensorCores"},
        {"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {}, "scoped VMEM limit"},
    };
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const override {
    int64_t seq = m.facts["seq"], d = m.facts["depth"];
    int64_t bq = effective_block(seq, 128, params.value("block_q", int64_t{512}));
    int64_t bk = effective_block(seq, 128, params.value("block_k", int64_t{512}));
    int64_t bb = effective_block(m.facts["batch"].get<int64_t>(), 1,
                                 params.value("block_b", int64_t{1}));
    int64_t in = dtype_bytes(m.facts["in_dtype"]);
    int64_t lanes_d = std::max<int64_t>(d, 128);
    // The dK/dV call is the largest: q, dO, k, v blocks and two stats, double-buffered; two
    // outputs; two f32 accumulators; s, p, dp, ds as f32 [bq, bk] temporaries.
    int64_t blocks = 2 * (2 * bq * lanes_d * in + 2 * bk * lanes_d * in + 2 * bq * 128 * 4);
    int64_t outs = 2 * 2 * bk * lanes_d * in;
    int64_t scratch = 2 * bk * lanes_d * 4;
    int64_t temps = 4 * bq * bk * 4;
    return bb * (blocks + outs + scratch + temps);
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    for (const char* b : {"block_q", "block_k"})
      if (!params.contains(b) || !params[b].is_number_integer() || params[b].get<int64_t>() < 1) {
        error = std::string("param ") + b + " must be a positive integer";
        return false;
      }
    if (params.contains("block_b") &&
        (!params["block_b"].is_number_integer() || params["block_b"].get<int64_t>() < 1)) {
      error = "param block_b must be a positive integer";
      return false;
    }
    auto mxu = params.value("mxu_dtype", std::string());
    if (mxu != "bfloat16" && mxu != "float32") {
      error = "param mxu_dtype must be bfloat16 or float32";
      return false;
    }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number()) {
      error = "param vmem_limit_bytes must be a number";
      return false;
    }
    const auto& sig = m.facts["signature"];
    auto arg = [&](const char* role) {
      return sig["names"][sig["graph_inputs"][m.facts[role].get<size_t>()].get<size_t>()]
          .get<std::string>();
    };
    nlohmann::json py = params;
    std::string returns;
    for (size_t o = 0; o < 3; ++o) {
      std::string role = m.facts["roles"][o];
      py[role + "_dtype"] = m.facts["out_dtypes"][o];
      returns += fmt::format("{}grads[\"{}\"]", o ? ", " : "", role);
    }
    return fill_template("attention_backward.py",
                         {{"header", header_comment(name(), m.summary, params.dump())},
                          {"params", python_literal(py)},
                          {"scale", fmt::format("{:.17g}", m.facts["scale"].get<double>())},
                          {"causal", m.facts["causal"].get<bool>() ? "True" : "False"},
                          {"perm", m.facts["perm"].dump()},
                          {"args", sig["args"].get<std::string>()},
                          {"q", arg("q")}, {"k", arg("k")}, {"v", arg("v")}, {"do", arg("do")},
                          {"returns", returns}},
                         source, error);
  }
};

}  // namespace

template_ptr make_attention_backward_template() {
  return std::make_shared<attention_backward_template>();
}

}  // namespace maxkernel::agents::expert
