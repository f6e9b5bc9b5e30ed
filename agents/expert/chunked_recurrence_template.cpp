// Template chunked_recurrence: a selective state-space scan (Mamba-2's SSD) however the
// reference writes it (the chunked einsum algorithm of the paper, einsum or dot spellings,
// other layouts of x and dt), recognised by the ROLES of its inputs in the computation:
//   x [b, t, h, p], dt [b, t, h], A [h], B and C [b, t, n] (one group), optional D [h];
//   a product A * dt feeds an exp (the decay); dt multiplies x (or B) (the discretisation);
//   B and C meet in the matmuls, and C is the one whose matmul partner carries B's
//   information (the state C reads; B only meets x, dt and C itself);
//   D, when present, multiplies x (the skip connection); the output has x's shape and
//   depends on every input.
// The kernel is the chunked scan (chunk axis last, state in VMEM scratch); the chunk length
// is a free parameter, since the recurrence's result does not depend on it.
// Refused: lax.scan / while forms (the analyze summary lists a loop body once, without its
// carried state, so the recurrence cannot be checked), inputs that are computed before use (softplus(dt + bias), A = -exp(A_log)), more
// than one B/C group, extra inputs, layouts the broadcasts do not pin down.
#include "agents/expert/block_size.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/layout_trace.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/softmax_attention_match.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_signature.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace maxkernel::agents::expert {

namespace {

using graph_facts::layout_trace;
using graph_facts::trace_layout;

value_ref input_ref(int k) { return value_ref{value_ref::kind::input, k, ""}; }
value_ref node_ref(int k) { return value_ref{value_ref::kind::node, k, ""}; }

// A mul whose two operands come (by layout only) from inputs a and b: their traces.
struct product {
  int node = -1;
  layout_trace lhs, rhs;  // lhs from a, rhs from b
};

// Per node: the graph inputs it depends on, as a bit mask (node ids are in graph order, so
// operands come first).
std::vector<uint64_t> input_masks(const graph_view& g) {
  std::vector<uint64_t> m(g.size(), 0);
  for (unsigned i = 0; i < g.size(); ++i)
    for (unsigned k = 0; k < g.operand_count(static_cast<int>(i)); ++k) {
      auto o = g.operand(static_cast<int>(i), k);
      if (o.is_input() && o.id < 64)
        m[i] |= uint64_t{1} << o.id;
      else if (o.is_node() && static_cast<unsigned>(o.id) < i)
        m[i] |= m[static_cast<size_t>(o.id)];
    }
  return m;
}

std::vector<product> products_of(const graph_view& g, int a, int b) {
  std::vector<product> out;
  for (int m : g.find("mul")) {
    auto t0 = trace_layout(g, g.operand(m, 0)), t1 = trace_layout(g, g.operand(m, 1));
    if (t0.input == a && t1.input == b)
      out.push_back({m, t0, t1});
    else if (t0.input == b && t1.input == a)
      out.push_back({m, t1, t0});
  }
  return out;
}

bool any_exp_after(const graph_view& g, int node) {
  for (int e : g.find("exp"))
    if (graph_facts::depends_on(g, node_ref(e), node))
      return true;
  return false;
}

// dims of `from` (a trace into a product) mapped onto the dims of `onto` (another trace into
// the same product): from dim i -> onto dim j when both land on the same product dim.
std::vector<int> relate(const layout_trace& from, const layout_trace& onto) {
  std::vector<int> r(from.to_value.size(), -1);
  for (size_t i = 0; i < from.to_value.size(); ++i)
    for (size_t j = 0; j < onto.to_value.size(); ++j)
      if (from.to_value[i] >= 0 && from.to_value[i] == onto.to_value[j])
        r[i] = static_cast<int>(j);
  return r;
}

class chunked_recurrence_template final : public kernel_template {
public:
  std::string name() const override { return "chunked_recurrence"; }
  std::string covers() const override {
    return "selective state-space scans (Mamba-2 SSD: x, dt, A, B, C, optional D skip) as a "
           "chunked scan with the state carried in VMEM across the chunk axis";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    if (g.output_count() != 1 || g.input_count() > 64)
      return std::nullopt;
    // A scan/while over time is summarised as one pass of its body, without the state it
    // carries: the recurrence cannot be verified, so it is refused.
    for (unsigned i = 0; i < g.size(); ++i)
      if (g.in_loop(static_cast<int>(i)))
        return std::nullopt;
    std::vector<int> r1, r3, r4;
    for (unsigned k = 0; k < g.input_count(); ++k) {
      auto s = g.shape(input_ref(static_cast<int>(k)));
      if (!is_float_dtype(g.dtype(input_ref(static_cast<int>(k)))))
        return std::nullopt;
      (s.size() == 1 ? r1 : s.size() == 3 ? r3 : s.size() == 4 ? r4 : r3).push_back(static_cast<int>(k));
      if (s.size() != 1 && s.size() != 3 && s.size() != 4)
        return std::nullopt;
    }
    if (r4.size() != 1 || r3.size() != 3 || r1.empty() || r1.size() > 2)
      return std::nullopt;
    int x = r4[0];
    auto out = g.output(0);
    if (g.shape(out) != g.shape(input_ref(x)))
      return std::nullopt;
    // A * dt feeding an exp: the decay.
    int a_in = -1, dt = -1;
    product adt;
    for (int a : r1)
      for (int d : r3)
        for (const auto& p : products_of(g, a, d))
          if (any_exp_after(g, p.node) && p.lhs.to_value.size() == 1 && p.lhs.to_value[0] >= 0) {
            if (a_in >= 0 && (a_in != a || dt != d))
              return std::nullopt;  // ambiguous
            a_in = a;
            dt = d;
            adt = p;
          }
    if (a_in < 0)
      return std::nullopt;
    // dt's head axis: where A's only dim lands
    auto dt_head_rel = relate(adt.lhs, adt.rhs);
    int dt_h = dt_head_rel[0];
    if (dt_h < 0)
      return std::nullopt;
    // dt multiplies x (or B): dt's dims on x's
    std::vector<int> bc;
    for (int k : r3)
      if (k != dt)
        bc.push_back(k);
    auto xs = products_of(g, dt, x);
    if (xs.empty())
      return std::nullopt;
    auto dt_on_x = relate(xs[0].lhs, xs[0].rhs);
    if (std::count(dt_on_x.begin(), dt_on_x.end(), -1) != 0)
      return std::nullopt;
    // C: the one of the pair with a matmul partner that carries B's information together with
    // other inputs (the state it reads); B's partners are C itself, or x/dt without C.
    auto masks = input_masks(g);
    auto mask_of = [&](const value_ref& v) -> uint64_t {
      return v.is_input() ? (uint64_t{1} << v.id) : v.is_node() ? masks[static_cast<size_t>(v.id)] : 0;
    };
    auto reads_other = [&](int u, int v) {
      uint64_t mu = uint64_t{1} << u, mv = uint64_t{1} << v;
      for (int d : g.find("dot_general"))
        for (unsigned side = 0; side < 2; ++side) {
          uint64_t here = mask_of(g.operand(d, side)), there = mask_of(g.operand(d, 1 - side));
          if (here == mu && (there & mv) && (there & ~mv))
            return true;
        }
      return false;
    };
    bool c0 = reads_other(bc[0], bc[1]), c1 = reads_other(bc[1], bc[0]);
    if (c0 == c1)
      return std::nullopt;
    int c_in = c0 ? bc[0] : bc[1], b_in = c0 ? bc[1] : bc[0];
    int d_in = -1;
    for (int k : r1)
      if (k != a_in)
        d_in = k;
    if (d_in >= 0 && products_of(g, d_in, x).empty())
      return std::nullopt;
    for (int k = 0; k < static_cast<int>(g.input_count()); ++k)
      if (!(mask_of(out) & (uint64_t{1} << k)))
        return std::nullopt;
    // Layouts. x: dt's dims land on (b, t, h); the dim dt does not reach is p. dt: the head
    // axis from A; of the other two the first is batch, the second seq.
    auto xshape = g.shape(input_ref(x)), dtshape = g.shape(input_ref(dt));
    std::vector<int> dt_bt;
    for (int i = 0; i < 3; ++i)
      if (i != dt_h)
        dt_bt.push_back(i);
    std::vector<int> dt_perm = {dt_bt[0], dt_bt[1], dt_h};
    std::vector<int> x_perm = {dt_on_x[static_cast<size_t>(dt_bt[0])],
                               dt_on_x[static_cast<size_t>(dt_bt[1])],
                               dt_on_x[static_cast<size_t>(dt_h)]};
    for (int i = 0; i < 4; ++i)
      if (std::find(x_perm.begin(), x_perm.end(), i) == x_perm.end())
        x_perm.push_back(i);
    if (x_perm.size() != 4)
      return std::nullopt;
    int64_t nb = dtshape[static_cast<size_t>(dt_bt[0])], nt = dtshape[static_cast<size_t>(dt_bt[1])];
    int64_t nh = dtshape[static_cast<size_t>(dt_h)];
    auto bshape = g.shape(input_ref(b_in));
    if (g.shape(input_ref(c_in)) != bshape)
      return std::nullopt;
    // B/C: (batch, seq) in that order, the state dim the remaining one (last unless the sizes
    // say otherwise).
    std::vector<int> bc_perm;
    for (int n_dim = 2; n_dim >= 0 && bc_perm.empty(); --n_dim) {
      std::vector<int> rest;
      for (int i = 0; i < 3; ++i)
        if (i != n_dim)
          rest.push_back(i);
      if (bshape[static_cast<size_t>(rest[0])] == nb && bshape[static_cast<size_t>(rest[1])] == nt)
        bc_perm = {rest[0], rest[1], n_dim};
    }
    if (bc_perm.empty() || g.shape(input_ref(a_in))[0] != nh)
      return std::nullopt;
    if (d_in >= 0 && g.shape(input_ref(d_in))[0] != nh)
      return std::nullopt;
    int64_t np = xshape[static_cast<size_t>(x_perm[3])];
    int64_t nn = bshape[static_cast<size_t>(bc_perm[2])];
    template_match m;
    m.family = name();
    m.summary = fmt::format("selective scan (SSD): batch {}, seq {}, heads {}, head_dim {}, state {}, "
                            "x=in{} dt=in{} A=in{} B=in{} C=in{}{}",
                            nb, nt, nh, np, nn, x, dt, a_in, b_in, c_in,
                            d_in >= 0 ? fmt::format(" D=in{}", d_in) : std::string(" (no D)"));
    m.facts = {{"x", x}, {"dt", dt}, {"A", a_in}, {"B", b_in}, {"C", c_in}, {"D", d_in},
               {"x_perm", x_perm}, {"dt_perm", dt_perm}, {"bc_perm", bc_perm},
               {"batch", nb}, {"seq", nt}, {"heads", nh}, {"head_dim", np}, {"state", nn},
               {"x_dtype", g.dtype(input_ref(x))}, {"bc_dtype", g.dtype(input_ref(b_in))},
               {"out_dtype", g.dtype(out)},
               {"signature", signature_facts(make_signature(spec))}};
    m.score = 1.0;
    return m;
  }

  nlohmann::json initial_params(const template_match& m,
                                const config::chip& chip) const override {
    int64_t seq = m.facts["seq"], heads = m.facts["heads"];
    nlohmann::json p = {{"block_t", effective_block(seq, 128, 256)},
                        // heads side by side fill 1024 lanes of the state dots
                        {"block_h", std::min<int64_t>(
                                        heads, std::max<int64_t>(
                                                   4, 1024 / m.facts["head_dim"].get<int64_t>()))},
                        // split_bf16: plain bf16 decay-weighted operands miss a 1e-2
                        // tolerance (tried); f32 dots take 3 MXU passes, split ones 2
                        {"mxu_dtype", "split_bf16"},
                        {"dimension_semantics", {"parallel", "parallel"}},
                        {"vmem_limit_bytes", chip.scoped_vmem_bytes}};
    if (token_major(m))
      p["x_layout"] = "in_place";
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes) * 3 / 4;
    for (int guard = 0; guard < 8 && vmem_bytes(m, p) > budget && p["block_h"].get<int64_t>() > 1; ++guard)
      p["block_h"] = p["block_h"].get<int64_t>() / 2;
    return p;
  }

  // x stored [b, t, h, p]: a block can read it (and write y) in place, [L, heads * P].
  static bool token_major(const template_match& m) {
    return m.facts["x_perm"] == nlohmann::json{0, 1, 2, 3};
  }

  // Whether these params read x in place (chunked_recurrence.py's in_place): heads in
  // lane-aligned groups (P divides 128 or is a multiple of it), the block's heads spanning
  // whole 128-lane tiles or being all of them.
  static bool in_place(const template_match& m, const nlohmann::json& params, int64_t hb) {
    int64_t heads = m.facts["heads"], p = m.facts["head_dim"];
    return token_major(m) && params.value("x_layout", "in_place") == "in_place" &&
           (p % 128 == 0 || 128 % p == 0) && ((hb * p) % 128 == 0 || hb == heads);
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    std::vector<tunable> ts = {
        {"block_t", tunable::kind::block, m.facts["seq"], 128, 2, 0, true, {},
         "time steps per chunk (the state is carried between chunks)"},
        {"block_h", tunable::kind::block, m.facts["heads"], 1, 1, 0, false, {},
         "heads per grid step (they share C B^T)"},
        {"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
         {nlohmann::json{"parallel", "parallel"}, nlohmann::json{"parallel", "arbitrary"}},
         "grid axes split across TensorCores"},
        {"mxu_dtype", tunable::kind::choice, 0, 1, -1, 0, false, {"split_bf16", "float32"},
         "the f32 operands of the per-head dots as two bf16 pieces, or as f32"},
        {"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {}, "scoped VMEM limit"},
    };
    if (token_major(m))
      ts.push_back({"x_layout", tunable::kind::choice, 0, 1, -1, 0, false,
                    {"in_place", "transposed"},
                    "x and y blocks of the token-major arrays (no copies around the kernel), or "
                    "head-major copies (one head per sublane block)"});
    return ts;
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const override {
    int64_t seq = m.facts["seq"], heads = m.facts["heads"];
    int64_t p = m.facts["head_dim"], n = m.facts["state"];
    int64_t L = effective_block(seq, 128, params.value("block_t", int64_t{256}));
    int64_t hb = std::max<int64_t>(1, params.value("block_h", int64_t{1}));
    while (heads % hb)
      --hb;
    int64_t xb = dtype_bytes(m.facts["x_dtype"]), bb = dtype_bytes(m.facts["bc_dtype"]);
    int64_t lanes_p = std::max<int64_t>(p, 128);
    // an x (and y) block: in place [L, hb * P] lanes, else hb blocks of [L, P]
    bool here = in_place(m, params, hb);
    int64_t x_elems = here ? L * ((hb * p + 127) / 128 * 128) : hb * L * lanes_p;
    int64_t blocks = 2 * (x_elems * xb                  // x
                          + 2 * L * std::max<int64_t>(n, 128) * bb   // B, C
                          + 2 * hb * 8 * L * 4          // two row vectors (sublane-padded)
                          + 2 * hb * L * 128 * 4        // two column vectors (lane-padded)
                          + x_elems * dtype_bytes(m.facts["out_dtype"]));
    // the states: side by side in place, else one [N, P] block per head
    int64_t scratch = here ? n * ((hb * p + 127) / 128 * 128) * 4 : hb * n * lanes_p * 4;
    int64_t temps = 4 * L * L * 4;  // C B^T, mask, decay, weighted matrix
    return blocks + scratch + temps;
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    for (const char* b : {"block_t", "block_h"})
      if (!params.contains(b) || !params[b].is_number_integer() || params[b].get<int64_t>() < 1) {
        error = std::string("param ") + b + " must be a positive integer";
        return false;
      }
    if (params.contains("x_layout") && params["x_layout"] != "in_place" &&
        params["x_layout"] != "transposed") {
      error = "param x_layout must be in_place or transposed";
      return false;
    }
    auto mxu = params.value("mxu_dtype", std::string());
    if (mxu != "bfloat16" && mxu != "float32" && mxu != "split_bf16") {
      error = "param mxu_dtype must be bfloat16, float32 or split_bf16";
      return false;
    }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number()) {
      error = "param vmem_limit_bytes must be a number";
      return false;
    }
    const auto& sig = m.facts["signature"];
    auto arg = [&](const char* role) -> std::string {
      int k = m.facts[role];
      if (k < 0)
        return "None";
      return sig["names"][sig["graph_inputs"][static_cast<size_t>(k)].get<size_t>()];
    };
    return fill_template("chunked_recurrence.py",
                         {{"header", header_comment(name(), m.summary, params.dump())},
                          {"params", python_literal(params)},
                          {"x_perm", m.facts["x_perm"].dump()},
                          {"dt_perm", m.facts["dt_perm"].dump()},
                          {"bc_perm", m.facts["bc_perm"].dump()},
                          {"has_d", m.facts["D"].get<int>() >= 0 ? "True" : "False"},
                          {"out_dtype", m.facts["out_dtype"].get<std::string>()},
                          {"args", sig["args"].get<std::string>()},
                          {"x", arg("x")}, {"dt", arg("dt")}, {"a", arg("A")}, {"b", arg("B")},
                          {"c", arg("C")}, {"d", arg("D")}},
                         source, error);
  }
};

}  // namespace

template_ptr make_chunked_recurrence_template() {
  return std::make_shared<chunked_recurrence_template>();
}

}  // namespace maxkernel::agents::expert
