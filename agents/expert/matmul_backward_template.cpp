// Template matmul_backward: a reference whose every output (two or more) is one GEMM of two
// inputs, each read in whatever stored layout: the backward pass of a dense layer
// (dX = dY W^T, dW = X^T dY) however it is spelled (jax.vjp, jax.grad, explicit .T, einsum),
// since all of them reach the graph as dot_generals over transposed/cast inputs. Each output
// becomes its own tiled Pallas matmul reading its operands K-major or not, so no transpose
// is materialised in HBM. Refused: batch dims, contracted or free dims that are not
// contiguous in an operand's stored order (a reshape would move data), anything between an
// input and the dot other than casts, transposes and scalar factors, single-output GEMMs
// (the matmul family's).
#include "agents/expert/block_size.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_signature.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace maxkernel::agents::expert {

namespace {


// One output as a GEMM: out[free(A)..., free(B)...] = scale * sum_k A[..] B[..].
struct gemm {
  int a = -1, b = -1;          // graph inputs
  bool a_kmajor = false;       // A stored [K..., M...]
  bool b_kmajor = true;        // B stored [K..., N...]
  int a_free = 0, b_free = 0;  // free dims of each (in the matrix part)
  int b_group = 0;             // leading dims of B the output leads with (A shared by them)
  int64_t m = 1, n = 1, k = 1, groups = 1;
  std::vector<std::vector<std::pair<int, int>>> out_dims;  // per output dim: (input, dim)s
  double scale = 1.0;
  std::string mxu_dtype, out_dtype, a_dtype, b_dtype;
};

bool contiguous(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] != v[i - 1] + 1)
      return false;
  return true;
}

// Output value -> GEMM, or false with a reason.
bool as_gemm(const graph_view& g, const value_ref& out, gemm& r, std::string& why) {
  auto ot = trace_operand(g, out);
  if (!ot.source.is_node() || g.primitive(ot.source.id) != "dot_general") {
    why = "an output is not a matmul of inputs";
    return false;
  }
  int dot = ot.source.id;
  if (g.in_loop(dot)) {
    why = "a matmul inside a loop body";
    return false;
  }
  const auto& p = g.params(dot);
  auto lc = p.value("lhs_contracting", std::vector<int>{});
  auto rc = p.value("rhs_contracting", std::vector<int>{});
  if (!p.value("lhs_batch", std::vector<int>{}).empty() || lc.empty() || lc.size() != rc.size()) {
    why = "a matmul with batch dims or no contraction";
    return false;
  }
  // Each side: the input it reads, and per dim of the dot operand the input dims it is (a
  // reshape that merges whole dims, x.reshape(-1, k), makes one dim of several).
  operand_trace side[2];
  std::vector<std::vector<int>> runs[2];
  for (int sd = 0; sd < 2; ++sd) {
    auto t = trace_operand(g, g.operand(dot, static_cast<unsigned>(sd)));
    runs[sd].assign(t.dims.size(), {});
    if (t.source.is_node() && g.primitive(t.source.id) == "reshape") {
      auto inner = trace_operand(g, g.operand(t.source.id, 0));
      auto si = g.shape(g.operand(t.source.id, 0)), so = g.shape(t.source);
      std::vector<std::vector<int>> merged(so.size());
      size_t q = 0;
      for (size_t j = 0; j < so.size(); ++j) {
        int64_t prod = 1;
        while (q < si.size() && (prod < so[j] || (si[q] == 1 && prod == so[j] && so[j] != 1))) {
          prod *= si[q];
          merged[j].push_back(inner.dims[q]);
          ++q;
        }
        if (prod != so[j]) {
          why = "a reshape that splits dims";
          return false;
        }
      }
      if (q != si.size() || !inner.source.is_input()) {
        why = "a reshape of a computed value";
        return false;
      }
      for (size_t d = 0; d < t.dims.size(); ++d)
        runs[sd][d] = merged[static_cast<size_t>(t.dims[d])];
      t.scale *= inner.scale;
      t.source = inner.source;
      if (is_float_dtype(inner.narrowest) && dtype_bytes(inner.narrowest) < dtype_bytes(t.narrowest))
        t.narrowest = inner.narrowest;
    } else {
      for (size_t d = 0; d < t.dims.size(); ++d)
        runs[sd][d] = {t.dims[d]};
    }
    side[sd] = t;
  }
  std::vector<int> contr[2] = {lc, rc};
  for (auto& sdt : side)
    if (!sdt.source.is_input()) {
      why = "a matmul operand is computed, not an input";
      return false;
    }
  // Free dims of each side in dot order (dot-level), and their input dims.
  std::vector<int> free_dot[2], free_in[2], contr_in[2];
  for (int sd = 0; sd < 2; ++sd) {
    auto rank = static_cast<int>(side[sd].dims.size());
    for (int d = 0; d < rank; ++d)
      if (std::find(contr[sd].begin(), contr[sd].end(), d) == contr[sd].end()) {
        free_dot[sd].push_back(d);
        for (int x : runs[sd][static_cast<size_t>(d)])
          free_in[sd].push_back(x);
      }
    for (int d : contr[sd])
      for (int x : runs[sd][static_cast<size_t>(d)])
        contr_in[sd].push_back(x);
  }
  // Output dim i -> (side, position among that side's free dims).
  auto nl = static_cast<int>(free_dot[0].size());
  std::vector<std::pair<int, int>> out_dims;
  for (int d : ot.dims)
    out_dims.push_back(d < nl ? std::pair{0, d} : std::pair{1, d - nl});
  // The output must be [free of X..., free of Y...], or [group dims of Y..., free of X...,
  // the rest of Y's free dims...] (Y's leading dims a batch that X is shared by).
  size_t i = 0;
  int out_run[3] = {-1, -1, -1};
  size_t ends[3] = {0, 0, 0};
  for (int rn = 0; rn < 3 && i < out_dims.size(); ++rn) {
    out_run[rn] = out_dims[i].first;
    while (i < out_dims.size() && out_dims[i].first == out_run[rn])
      ++i;
    ends[rn] = i;
  }
  if (i != out_dims.size() || out_run[1] < 0 || (out_run[2] >= 0 && out_run[2] != out_run[0])) {
    why = "the output's dims interleave the operands' free dims";
    return false;
  }
  int x = out_run[2] < 0 ? out_run[0] : out_run[1];
  int y = 1 - x;
  size_t group = out_run[2] < 0 ? 0 : ends[0];
  // positions run 0.. in each side's free-dim order
  {
    std::vector<int> seen_pos[2];
    for (auto [sd, pos] : out_dims)
      seen_pos[sd].push_back(pos);
    for (int sd = 0; sd < 2; ++sd)
      for (size_t q = 0; q < seen_pos[sd].size(); ++q)
        if (seen_pos[sd][q] != static_cast<int>(q)) {
          why = "the output reorders an operand's free dims";
          return false;
        }
  }
  // Y's group dims lead its stored layout, in order; the matrix part follows.
  std::vector<int> group_in;
  for (size_t q = 0; q < group; ++q)
    for (int d : runs[y][static_cast<size_t>(free_dot[y][q])])
      group_in.push_back(d);
  for (size_t q = 0; q < group_in.size(); ++q)
    if (group_in[q] != static_cast<int>(q)) {
      why = "an operand's group dims do not lead its layout";
      return false;
    }
  free_in[y].erase(free_in[y].begin(), free_in[y].begin() + static_cast<long>(group_in.size()));
  // Stored order: free dims increasing and contiguous, contracted dims contiguous, paired in
  // the same order on both sides, and free and contracted blocks at opposite ends.
  bool kmajor[2];
  for (int sd = 0; sd < 2; ++sd) {
    if (!std::is_sorted(free_in[sd].begin(), free_in[sd].end()) || !contiguous(free_in[sd]) ||
        !contiguous(contr_in[sd])) {
      why = "an operand's free or contracted dims are not contiguous in its layout";
      return false;
    }
    kmajor[sd] = free_in[sd].empty() || (!contr_in[sd].empty() && contr_in[sd][0] < free_in[sd][0]);
  }
  std::vector<size_t> order(lc.size());
  std::iota(order.begin(), order.end(), 0);
  auto first_of = [&](int sd, size_t c) { return runs[sd][static_cast<size_t>(contr[sd][c])].front(); };
  std::sort(order.begin(), order.end(),
            [&](size_t u, size_t v) { return first_of(0, u) < first_of(0, v); });
  for (size_t i = 1; i < order.size(); ++i)
    if (first_of(1, order[i]) < first_of(1, order[i - 1])) {
      why = "contracted dims pair up in different orders";
      return false;
    }
  r.a = side[x].source.id;
  r.b = side[y].source.id;
  r.a_kmajor = kmajor[x];
  r.b_kmajor = kmajor[y];
  r.a_free = static_cast<int>(free_in[x].size());
  r.b_free = static_cast<int>(free_in[y].size());
  r.b_group = static_cast<int>(group);
  auto sa = g.shape(side[x].source), sb = g.shape(side[y].source);
  r.m = r.n = r.k = r.groups = 1;
  for (int d : group_in)
    r.groups *= sb[static_cast<size_t>(d)];
  for (int d : free_in[x])
    r.m *= sa[static_cast<size_t>(d)];
  for (int d : free_in[y])
    r.n *= sb[static_cast<size_t>(d)];
  for (int d : contr_in[x])
    r.k *= sa[static_cast<size_t>(d)];
  r.scale = ot.scale * side[0].scale * side[1].scale;
  r.a_dtype = g.dtype(side[x].source);
  r.b_dtype = g.dtype(side[y].source);
  // The values the MXU must see: each operand rounded as the reference rounds it; inputs of
  // one narrow dtype multiply exactly in it with f32 accumulation.
  std::string na = side[x].narrowest, nb = side[y].narrowest;
  if (!is_float_dtype(na) || !is_float_dtype(nb)) {
    why = "an integer matmul (the quantized family's)";
    return false;
  }
  r.mxu_dtype = na == nb ? na : "float32";
  for (auto [sd, pos] : out_dims) {
    std::vector<std::pair<int, int>> dims;  // (input, dim)
    for (int d : runs[sd][static_cast<size_t>(free_dot[sd][static_cast<size_t>(pos)])])
      dims.push_back({side[sd].source.id, d});
    r.out_dims.push_back(dims);
  }
  r.out_dtype = g.dtype(out);
  return true;
}

int sublane(const std::string& dtype) {
  int b = dtype_bytes(dtype);
  return b == 1 ? 32 : b == 2 ? 16 : 8;
}

struct aligns {
  int64_t m, n, k;
};

aligns alignment(const nlohmann::json& p) {
  bool ak = p["a_kmajor"], bk = p["b_kmajor"];
  int sa = sublane(p["a_dtype"]), sb = sublane(p["b_dtype"]);
  return {ak ? 128 : sa, 128, (ak && bk) ? std::max(sa, sb) : 128};
}

// Two names over one kernel: "matmul_backward" takes references with two or more GEMM
// outputs; "shared_operand_matmul" a single GEMM whose B carries leading batch dims that A
// is shared by (einsum mk,dkn->dmn: each device's shard of an all-gather matmul), which the
// plain matmul family (batch dims on both operands) does not take.
class matmul_backward_template final : public kernel_template {
public:
  explicit matmul_backward_template(bool shared) : shared_(shared) {}
  std::string name() const override {
    return shared_ ? "shared_operand_matmul" : "matmul_backward";
  }
  std::string covers() const override {
    return shared_ ? "one GEMM whose B has leading batch dims that A is shared by (out[d] = "
                     "X @ W[d]: the all-gather matmul written as one program)"
                   : "several GEMMs of the inputs in one module, operands read transposed or "
                     "not (the backward pass of a dense layer: dX = dY W^T, dW = X^T dY)";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    if (shared_ ? g.output_count() != 1 : g.output_count() < 2)
      return std::nullopt;  // one plain GEMM is the matmul family's
    nlohmann::json products = nlohmann::json::array();
    std::string summary;
    for (unsigned o = 0; o < g.output_count(); ++o) {
      gemm r;
      std::string why;
      if (!as_gemm(g, g.output(o), r, why) || (shared_ && r.b_group == 0))
        return std::nullopt;
      products.push_back({{"a", r.a}, {"b", r.b}, {"a_kmajor", r.a_kmajor},
                          {"b_kmajor", r.b_kmajor}, {"a_free", r.a_free}, {"b_free", r.b_free},
                          {"b_group", r.b_group}, {"groups", r.groups}, {"out_dims", r.out_dims},
                          {"m", r.m}, {"n", r.n}, {"k", r.k}, {"scale", r.scale},
                          {"mxu_dtype", r.mxu_dtype}, {"out_dtype", r.out_dtype},
                          {"a_dtype", r.a_dtype}, {"b_dtype", r.b_dtype}});
      summary += fmt::format("{}out{} = {}{}{} @ {}{}{} ({}x{}x{}, {})", o ? "; " : "", o,
                             r.scale != 1.0 ? fmt::format("{:g} * ", r.scale) : "",
                             "in" + std::to_string(r.a), r.a_kmajor ? "^T" : "",
                             "in" + std::to_string(r.b), r.b_kmajor ? "" : "^T",
                             r.b_group ? fmt::format(" per each of {} batches of B", r.groups) : "",
                             r.m, r.k, r.n,
                             r.mxu_dtype);
    }
    template_match m;
    m.family = name();
    m.summary = summary;
    m.facts = {{"products", products}, {"signature", signature_facts(make_signature(spec))}};
    m.score = 1.0;
    return m;
  }

  nlohmann::json initial_params(const template_match& m,
                                const config::chip& chip) const override {
    nlohmann::json p = {{"dimension_semantics", {"parallel", "parallel"}},
                        {"vmem_limit_bytes", chip.scoped_vmem_bytes}};
    int64_t big = chip.mxu_size >= 256 ? 1024 : 512;
    const auto& prods = m.facts["products"];
    for (size_t j = 0; j < prods.size(); ++j) {
      auto al = alignment(prods[j]);
      p[fmt::format("bm{}", j)] = effective_block(prods[j]["m"], al.m, big);
      p[fmt::format("bn{}", j)] = effective_block(prods[j]["n"], al.n, big);
      p[fmt::format("bk{}", j)] = effective_block(prods[j]["k"], al.k, 512);
      p[fmt::format("order{}", j)] = "mn";
    }
    // Halve the largest block of the hungriest GEMM until it fits 3/4 of the scoped limit.
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes) * 3 / 4;
    for (int guard = 0; guard < 32 && vmem_bytes(m, p) > budget; ++guard) {
      std::string worst;
      int64_t worst_v = 0;
      for (size_t j = 0; j < prods.size(); ++j)
        for (const char* b : {"bm", "bn", "bk"}) {
          auto key = fmt::format("{}{}", b, j);
          if (p[key].get<int64_t>() > worst_v) {
            worst_v = p[key];
            worst = key;
          }
        }
      if (worst_v <= 128)
        break;
      p[worst] = worst_v / 2;
    }
    return p;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    std::vector<tunable> ts;
    const auto& prods = m.facts["products"];
    for (size_t j = 0; j < prods.size(); ++j) {
      auto al = alignment(prods[j]);
      int call = static_cast<int>(j);
      ts.push_back({fmt::format("bm{}", j), tunable::kind::block, prods[j]["m"], al.m, 1, call,
                    false, {}, fmt::format("rows of output {} per block", j)});
      ts.push_back({fmt::format("bn{}", j), tunable::kind::block, prods[j]["n"], al.n, 2, call,
                    false, {}, fmt::format("columns of output {} per block", j)});
      ts.push_back({fmt::format("bk{}", j), tunable::kind::block, prods[j]["k"], al.k, 3, call,
                    true, {}, fmt::format("contracted elements of output {} per step", j)});
      ts.push_back({fmt::format("order{}", j), tunable::kind::choice, 0, 1, -1, call, false,
                    {"mn", "nm"}, "grid order of rows and columns (which operand stays put)"});
    }
    ts.push_back({"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
                  {nlohmann::json{"parallel", "parallel"}, nlohmann::json{"parallel", "arbitrary"}},
                  "which output axes are split across TensorCores"});
    ts.push_back({"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {},
                  "scoped VMEM limit"});
    return ts;
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const override {
    int64_t most = 0;
    const auto& prods = m.facts["products"];
    for (size_t j = 0; j < prods.size(); ++j) {
      const auto& pr = prods[j];
      auto al = alignment(pr);
      int64_t bm = effective_block(pr["m"], al.m, params.value(fmt::format("bm{}", j), 512));
      int64_t bn = effective_block(pr["n"], al.n, params.value(fmt::format("bn{}", j), 512));
      int64_t bk = effective_block(pr["k"], al.k, params.value(fmt::format("bk{}", j), 512));
      int64_t need = 2 * (bm * bk * dtype_bytes(pr["a_dtype"]) + bk * bn * dtype_bytes(pr["b_dtype"]) +
                          bm * bn * dtype_bytes(pr["out_dtype"])) +
                     bm * bn * 4;
      most = std::max(most, need);  // the calls run one after another
    }
    return most;
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    const auto& prods = m.facts["products"];
    for (size_t j = 0; j < prods.size(); ++j)
      for (const char* b : {"bm", "bn", "bk"}) {
        auto key = fmt::format("{}{}", b, j);
        if (!params.contains(key) || !params[key].is_number_integer() || params[key].get<int64_t>() < 1) {
          error = "param " + key + " must be a positive integer";
          return false;
        }
      }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number()) {
      error = "param vmem_limit_bytes must be a number";
      return false;
    }
    auto sem = params.value("dimension_semantics", nlohmann::json::array());
    if (!sem.is_array() || sem.size() != 2) {
      error = "param dimension_semantics must be a list of two";
      return false;
    }
    const auto& sig = m.facts["signature"];
    nlohmann::json py = nlohmann::json::array();
    std::string returns, out_shapes = "[\n";
    for (size_t j = 0; j < prods.size(); ++j) {
      const auto& pr = prods[j];
      py.push_back({{"a", sig["graph_inputs"][pr["a"].get<size_t>()]},
                    {"b", sig["graph_inputs"][pr["b"].get<size_t>()]},
                    {"a_kmajor", pr["a_kmajor"]}, {"b_kmajor", pr["b_kmajor"]},
                    {"a_group", 0}, {"b_group", pr.value("b_group", 0)},
                    {"a_free", pr["a_free"]}, {"b_free", pr["b_free"]}, {"scale", pr["scale"]},
                    {"mxu_dtype", pr["mxu_dtype"]}, {"out_dtype", pr["out_dtype"]}});
      returns += fmt::format("{}outs[{}]", j ? ", " : "", j);
      std::string shape;
      for (const auto& od : pr["out_dims"]) {
        std::string dim;
        for (const auto& id : od)
          dim += fmt::format("{}i[{}].shape[{}]", dim.empty() ? "" : " * ",
                             sig["graph_inputs"][id[0].get<size_t>()].get<int>(), id[1].get<int>());
        shape += (dim.empty() ? std::string("1") : dim) + ", ";
      }
      out_shapes += "    lambda i: (" + shape + "),\n";
    }
    std::string py_params = params.dump();
    return fill_template("matmul_backward.py",
                         {{"header", header_comment(name(), m.summary, py_params)},
                          {"params", python_literal(params)},
                          {"products", python_literal(py)},
                          {"args", sig["args"].get<std::string>()},
                          {"out_shapes", out_shapes + "]"},
                          {"returns", returns}},
                         source, error);
  }


private:
  bool shared_;
};

}  // namespace

template_ptr make_matmul_backward_template() {
  return std::make_shared<matmul_backward_template>(false);
}

template_ptr make_shared_operand_matmul_template() {
  return std::make_shared<matmul_backward_template>(true);
}

}  // namespace maxkernel::agents::expert
