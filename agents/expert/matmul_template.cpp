// Template "matmul": out = epilogue(A @ B) for references whose matmuls are dot_generals with
// one contracting dim per operand (either operand transposed, batch dims as a leading grid
// axis), their operands graph inputs behind casts, transposes and scalar factors, and
// everything after them an elementwise / row-reduction chain that block_program can
// generate. Several dots are fused when they share the output space and K (x @ w1, x @ w2
// combined elementwise). f32 (int32 for integer dots) accumulation in VMEM scratch over the K
// grid axis; the epilogue runs on the last K step: per tile (elementwise), on whole rows
// (bn = N, when it needs row reductions of a row-shaped output), or streamed over N blocks
// with running row statistics (logsumexp, cross-entropy: outputs are row statistics only).
#include "agents/expert/block_program.hpp"
#include "agents/expert/block_size.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_signature.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace maxkernel::agents::expert {

namespace {

using json = nlohmann::json;

int64_t round_up(int64_t x, int64_t m) { return m <= 0 ? x : (x + m - 1) / m * m; }

// Sublane alignment of a block's second-minor dim for a dtype (packed types take more rows).
int64_t sublane_align(const std::string& dtype) {
  int b = dtype_bytes(dtype);
  return b >= 4 ? 8 : 8 * (4 / b);
}

// Bytes of a (rows, cols) VMEM tile as laid out in (sublane, 128) tiles.
int64_t tile_bytes(int64_t rows, int64_t cols, const std::string& dtype) {
  return round_up(rows, sublane_align(dtype)) * round_up(cols, 128) * dtype_bytes(dtype);
}

std::string product_expr(const std::vector<std::string>& exprs) {
  if (exprs.empty())
    return "1";
  std::string s;
  for (size_t i = 0; i < exprs.size(); ++i)
    s += (i ? " * " : "") + exprs[i];
  return exprs.size() == 1 ? s : "(" + s + ")";
}

// One dot operand: a graph input seen in canonical (batch, rows, cols) form.
struct mat_operand {
  int input = -1;
  std::string layout;               // mk km (lhs) kn nk (rhs)
  std::vector<std::string> casts;   // dtypes its blocks are cast through, in order
  std::string dtype;                // stored dtype
  bool operator<(const mat_operand& o) const {
    return std::tie(input, layout, casts) < std::tie(o.input, o.layout, o.casts);
  }
};

struct dot_side {
  int input = -1;
  std::string layout;
  std::vector<int> batch, free, k;  // source dims of each role, in order
  double scale = 1.0;
  std::string source_dtype, narrowest, operand_dtype;
};

// Where a dot operand's dims come from: per dim, the run of dims of a graph input it merges,
// through casts, transposes, scalar factors and reshapes that merge whole dims
// (x.reshape(-1, k) @ w, einsum's transposes, w.T, w.astype(bf16) * s).
struct view_trace {
  value_ref source;
  std::vector<std::vector<int>> dims;
  double scale = 1.0;
  std::string narrowest;
};

bool trace_view(const graph_view& g, value_ref v, view_trace& out) {
  auto rank = g.shape(v).size();
  out.dims.assign(rank, {});
  for (size_t d = 0; d < rank; ++d)
    out.dims[d] = {static_cast<int>(d)};
  out.narrowest = g.dtype(v);
  for (int guard = 0; guard < 16; ++guard) {
    auto t = trace_operand(g, v);
    out.scale *= t.scale;
    if (is_float_dtype(t.narrowest) &&
        (!is_float_dtype(out.narrowest) || dtype_bytes(t.narrowest) < dtype_bytes(out.narrowest)))
      out.narrowest = t.narrowest;
    for (auto& run : out.dims)
      for (auto& d : run)
        d = t.dims[static_cast<size_t>(d)];
    v = t.source;
    if (v.is_input()) {
      out.source = v;
      return true;
    }
    if (!v.is_node() || g.primitive(v.id) != "reshape")
      return false;
    // A reshape that merges whole dims: each of its dims is a run of its operand's dims.
    auto to = g.shape(v);
    auto in_ref = g.operand(v.id, 0);
    auto from = g.shape(in_ref);
    std::vector<std::vector<int>> groups(to.size());
    size_t i = 0;
    for (size_t o = 0; o < to.size(); ++o) {
      int64_t prod = 1;
      while (i < from.size() && (prod < to[o] || (to[o] == 1 && from[i] == 1 && prod == 1 &&
                                                  groups[o].empty()))) {
        prod *= from[i];
        groups[o].push_back(static_cast<int>(i++));
      }
      if (prod != to[o])
        return false;  // splits a dim
    }
    while (i < from.size())
      if (from[i++] != 1)
        return false;
    for (auto& run : out.dims) {
      std::vector<int> merged;
      for (int d : run)
        for (int x : groups[static_cast<size_t>(d)])
          merged.push_back(x);
      run = merged;
    }
    v = in_ref;
  }
  return false;
}

bool contiguous(const std::vector<int>& run) {
  for (size_t i = 1; i < run.size(); ++i)
    if (run[i] != run[i - 1] + 1)
      return false;
  return true;
}

// Reads one side of a dot: its source input, where batch / free / contracting dims sit.
bool read_side(const graph_view& g, int dot, unsigned which, const std::vector<int>& batch,
               int contracting, dot_side& side, std::string& why, unsigned role) {
  view_trace t;
  if (!trace_view(g, g.operand(dot, which), t)) {
    why = "a dot operand is not a graph input behind casts, transposes and merging reshapes";
    return false;
  }
  side.input = t.source.id;
  side.scale = t.scale;
  side.source_dtype = g.dtype(t.source);
  side.narrowest = t.narrowest;
  side.operand_dtype = g.dtype(g.operand(dot, which));
  auto rank = static_cast<int>(g.shape(t.source).size());
  for (int b : batch)
    for (int d : t.dims[static_cast<size_t>(b)])
      side.batch.push_back(d);
  side.k = t.dims[static_cast<size_t>(contracting)];
  auto oprank = static_cast<int>(t.dims.size());
  for (int d = 0; d < oprank; ++d)
    if (std::find(batch.begin(), batch.end(), d) == batch.end() && d != contracting)
      for (int x : t.dims[static_cast<size_t>(d)])
        side.free.push_back(x);
  int nb = static_cast<int>(side.batch.size());
  for (int i = 0; i < nb; ++i)
    if (side.batch[static_cast<size_t>(i)] != i) {
      why = "batch dims are not the leading dims of a dot operand";
      return false;
    }
  if (side.k.empty() || !contiguous(side.k) || !contiguous(side.free)) {
    why = "the free or contracted dims of a dot operand are not contiguous in its input";
    return false;
  }
  // Free dims then K last, or K right after the batch dims then the free dims.
  bool k_last = side.k.back() == rank - 1 && (side.free.empty() || side.free[0] == nb) &&
                side.k.front() == nb + static_cast<int>(side.free.size());
  bool k_first = side.k.front() == nb && (side.free.empty() || side.free.back() == rank - 1) &&
                 nb + static_cast<int>(side.k.size() + side.free.size()) == rank;
  if (role == 0)
    side.layout = k_last ? "mk" : k_first ? "km" : "";
  else
    side.layout = k_first ? "kn" : k_last ? "nk" : "";
  if (side.layout.empty()) {
    why = "the contracting dim of a dot operand sits between its free dims";
    return false;
  }
  return true;
}

class matmul_template final : public kernel_template {
public:
  std::string name() const override { return "matmul"; }
  std::string covers() const override {
    return "tiled (batched) matmul of any operand layout and int8/fp8/bf16/f32 inputs with a "
           "fused epilogue generated from the reference: bias, residual, activations, scales, "
           "row reductions (norms, softmax, logsumexp, cross-entropy) of the output";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    auto dots = g.find("dot_general");
    if (dots.empty() || dots.size() > 4)
      return std::nullopt;
    auto sig = make_signature(spec);
    if (sig.graph_inputs.size() != g.input_count())
      return std::nullopt;
    std::string why;
    std::vector<dot_side> lhs(dots.size()), rhs(dots.size());
    std::vector<int64_t> shape0;
    int64_t k0 = -1;
    std::vector<int> seeds(dots.size());
    for (size_t d = 0; d < dots.size(); ++d) {
      int id = dots[d];
      if (g.in_loop(id))
        return std::nullopt;
      const auto& p = g.params(id);
      auto lc = p.value("lhs_contracting", std::vector<int>{});
      auto rc = p.value("rhs_contracting", std::vector<int>{});
      auto lb = p.value("lhs_batch", std::vector<int>{});
      auto rb = p.value("rhs_batch", std::vector<int>{});
      // One contracting dim each (several would need a reshape of the operands).
      if (lc.size() != 1 || rc.size() != 1 || lb.size() != rb.size())
        return std::nullopt;
      // A dot whose only use is a transpose swapping its free dims ((x @ w).T, einsum
      // "mk,kn->nm") is computed as the swapped product: out.T = w.T @ x.T.
      seeds[d] = id;
      bool swapped = false;
      if (g.consumers(id).size() == 1 && g.primitive(g.consumers(id)[0]) == "transpose") {
        int t = g.consumers(id)[0];
        auto perm = g.params(t).value("permutation", std::vector<int>{});
        int nb = static_cast<int>(lb.size());
        int fl = static_cast<int>(g.shape(g.operand(id, 0)).size()) - nb - 1;
        int fr = static_cast<int>(g.shape(g.operand(id, 1)).size()) - nb - 1;
        std::vector<int> want;
        for (int i = 0; i < nb; ++i)
          want.push_back(i);
        for (int i = 0; i < fr; ++i)
          want.push_back(nb + fl + i);
        for (int i = 0; i < fl; ++i)
          want.push_back(nb + i);
        swapped = perm == want && fl > 0 && fr > 0;
        if (swapped)
          seeds[d] = t;
      }
      bool read_ok = swapped ? read_side(g, id, 1, rb, rc[0], lhs[d], why, 0) &&
                                   read_side(g, id, 0, lb, lc[0], rhs[d], why, 1)
                             : read_side(g, id, 0, lb, lc[0], lhs[d], why, 0) &&
                                   read_side(g, id, 1, rb, rc[0], rhs[d], why, 1);
      if (!read_ok)
        return std::nullopt;
      value_ref out;
      out.what = value_ref::kind::node;
      out.id = seeds[d];
      auto shape = g.shape(out);
      auto lshape = g.shape(g.operand(id, 0));
      int64_t k = lshape[static_cast<size_t>(lc[0])];
      if (d == 0) {
        shape0 = shape;
        k0 = k;
      } else if (shape != shape0) {
        return std::nullopt;  // several dots, but not over one output space
      }
      // integer dots accumulate in int32, float ones in f32; no mixing
      bool int_dot = !is_float_dtype(g.dtype(out));
      bool int0 = !is_float_dtype(g.dtype(value_ref{value_ref::kind::node, dots[0], ""}));
      if (int_dot != int0)
        return std::nullopt;
    }

    // The space: batch (squeezed), M = lhs free dims, N = rhs free dims of the first dot.
    value_ref lhs0{value_ref::kind::input, lhs[0].input, ""};
    value_ref rhs0{value_ref::kind::input, rhs[0].input, ""};
    auto lshape = g.shape(lhs0), rshape = g.shape(rhs0);
    const std::string& lname = sig.input(lhs[0].input);
    const std::string& rname = sig.input(rhs[0].input);
    std::vector<space_axis> space(3);
    space[0].squeezed = true;
    for (int d : lhs[0].batch) {
      space[0].factors.push_back(lshape[static_cast<size_t>(d)]);
      space[0].factor_exprs.push_back(fmt::format("{}.shape[{}]", lname, d));
    }
    for (int d : lhs[0].free) {
      space[1].factors.push_back(lshape[static_cast<size_t>(d)]);
      space[1].factor_exprs.push_back(fmt::format("{}.shape[{}]", lname, d));
    }
    for (int d : rhs[0].free) {
      space[2].factors.push_back(rshape[static_cast<size_t>(d)]);
      space[2].factor_exprs.push_back(fmt::format("{}.shape[{}]", rname, d));
    }
    // member_outer: sp's N axis is `space`'s with its leading factor moved last (the members),
    // and the seeds' dims follow (see block_request::member_outer).
    auto program = [&](const std::vector<space_axis>& sp, block_program& prog,
                       bool member_outer) {
      block_request req;
      req.space = sp;
      req.name = "epilogue";
      req.stream_axis = sp.size() == 3 ? 2 : -1;
      req.member_outer = member_outer;
      for (int id : seeds) {
        block_seed s;
        s.value = {value_ref::kind::node, id, ""};
        if (!map_dims_to_factors(g.shape(s.value), member_outer ? space : sp, s.dims))
          return false;
        if (member_outer) {
          int nf = static_cast<int>(sp[2].factors.size());
          for (auto& d : s.dims) {
            if (d.unit() || d.axis != 2)
              continue;
            if (d.hi != d.lo + 1)
              return false;  // a dim merging the members with other factors
            d.lo = d.lo == 0 ? nf - 1 : d.lo - 1;
            d.hi = d.lo + 1;
          }
        }
        req.seeds.push_back(s);
      }
      for (unsigned k = 0; k < g.output_count(); ++k)
        req.outputs.push_back(g.output(k));
      return build_block_program(g, req, prog, why);
    };
    block_program prog;
    // Axis presence for the kernel's BlockSpecs (batch, M, N); with N split, N is present
    // when its inner part is (the outer part is the block index).
    bool n_split = false, pool_outer = false;
    // Static slices of single members of N's leading factor (gates[:, g] of [M, G, N']
    // products; G a count the reference slices with constant indices, so it stays at every
    // size): the members become the pooled trailing factor of a member-outer N axis.
    auto try_members = [&]() {
      if (space[2].factors.size() < 2 || space[2].factors[0] < 2 || space[2].factors[0] > 16)
        return false;
      std::vector<space_axis> ms = space;
      auto& n = ms[2];
      int64_t members = n.factors[0];
      n.factors.erase(n.factors.begin());
      n.factor_exprs.erase(n.factor_exprs.begin());
      n.factors.push_back(members);
      n.factor_exprs.push_back(std::to_string(members));
      block_program mp;
      std::string why_before = why;
      if (!program(ms, mp, true) || mp.pool_axis != 2 || mp.pool != members) {
        why = why_before;
        return false;
      }
      prog = std::move(mp);
      space = ms;
      return true;
    };
    if (!program(space, prog, false) && !(pool_outer = try_members())) {
      // Reductions over the last rhs free dim alone (a norm per head of "mk,khd->mhd"): split
      // N into an outer part on the grid (one per block) and an inner part a block spans.
      if (space[2].factors.size() < 2)
        return std::nullopt;  // an epilogue the generator cannot express (why says what)
      std::vector<space_axis> split(4);
      split[0] = space[0];
      split[1] = space[1];
      split[2].squeezed = true;
      split[2].factors.assign(space[2].factors.begin(), space[2].factors.end() - 1);
      split[2].factor_exprs.assign(space[2].factor_exprs.begin(), space[2].factor_exprs.end() - 1);
      split[3].factors = {space[2].factors.back()};
      split[3].factor_exprs = {space[2].factor_exprs.back()};
      why.clear();
      if (!program(split, prog, false) || !prog.reduced[3])
        return std::nullopt;
      n_split = true;
      space = split;
    }
    auto pres3 = [&](const std::vector<bool>& p, bool& ok) {
      if (!n_split)
        return std::vector<bool>{p[0], p[1], p[2]};
      ok = ok && (p[3] || !p[2]);  // a per-group value without the inner part: no BlockSpec
      return std::vector<bool>{p[0], p[1], p[3]};
    };
    for (auto& o : prog.outputs)
      if (!o.present[0] && space[0].extent() > 1)
        return std::nullopt;
    // A pooled epilogue (maxout: groups of `pool` adjacent columns reduced to one) runs on
    // member-major column blocks: the wrapper permutes w's columns (and the extras spanning
    // N) within each block, and the output block is bn / pool wide. Only along N, in tile
    // mode (a row reduction of N as well would need whole rows: not done).
    int64_t pool = prog.pool_axis >= 0 ? prog.pool : 1;
    if (pool > 1 && (n_split || prog.pool_axis != 2 || prog.reduced[2]))
      return std::nullopt;

    // Contractions: dots whose K is another dim (x @ w_ih + h @ w_hh) run as segments of
    // the K grid axis, one after the other; dots over one K (x @ w1, x @ w2) share steps.
    std::vector<std::string> k_exprs;
    std::vector<int> dot_segment(dots.size());
    for (size_t d = 0; d < dots.size(); ++d) {
      std::vector<std::string> ke;
      for (int kd : lhs[d].k)
        ke.push_back(fmt::format("{}.shape[{}]", sig.input(lhs[d].input), kd));
      std::string e = product_expr(ke);
      auto it = std::find(k_exprs.begin(), k_exprs.end(), e);
      dot_segment[d] = static_cast<int>(it - k_exprs.begin());
      if (it == k_exprs.end())
        k_exprs.push_back(e);
    }
    std::vector<int> mat_segment;

    // Canonical operands (deduplicated: x @ w1 and x @ w2 read x once).
    bool int_dot = !is_float_dtype(g.dtype(value_ref{value_ref::kind::node, dots[0], ""}));
    std::vector<mat_operand> mats;
    std::map<mat_operand, int> index;
    json dot_list = json::array();
    for (size_t d = 0; d < dots.size(); ++d) {
      // The dtype the MXU sees: the dot's operand dtype; fp8 runs as bf16 (exact), and a
      // float pair of different widths as the wider.
      auto compute = [&](const dot_side& s) {
        std::string dt = s.operand_dtype;
        if (dt.rfind("float8", 0) == 0)
          dt = "bfloat16";
        return dt;
      };
      std::string cl = compute(lhs[d]), cr = compute(rhs[d]);
      if (!int_dot && cl != cr)
        cl = cr = dtype_bytes(cl) >= dtype_bytes(cr) ? cl : cr;
      if (int_dot && (is_float_dtype(cl) || is_float_dtype(cr)))
        return std::nullopt;
      int ids[2];
      for (int w = 0; w < 2; ++w) {
        const dot_side& s = w == 0 ? lhs[d] : rhs[d];
        mat_operand m;
        m.input = s.input;
        m.layout = s.layout;
        m.dtype = s.source_dtype;
        std::string last = s.source_dtype;
        if (is_float_dtype(s.narrowest) && s.narrowest != last &&
            dtype_bytes(s.narrowest) < dtype_bytes(last)) {
          m.casts.push_back(s.narrowest);
          last = s.narrowest;
        }
        std::string want = w == 0 ? cl : cr;
        if (want != last)
          m.casts.push_back(want);
        auto it = index.find(m);
        if (it == index.end()) {
          it = index.emplace(m, static_cast<int>(mats.size())).first;
          mats.push_back(m);
          mat_segment.push_back(dot_segment[d]);
        } else if (mat_segment[static_cast<size_t>(it->second)] != dot_segment[d]) {
          return std::nullopt;  // one operand in two contractions
        }
        ids[w] = it->second;
      }
      dot_list.push_back({ids[0], ids[1], lhs[d].scale * rhs[d].scale});
    }

    // Alignment of M, N, K blocks: lane dims 128, sublane dims by dtype packing.
    int64_t am = 8, an = 8, ak = 8;
    auto need = [](int64_t& a, int64_t v) { a = std::max(a, v); };
    for (auto& m : mats) {
      int64_t sub = sublane_align(m.dtype);
      if (m.layout == "mk") { need(am, sub); need(ak, 128); }
      if (m.layout == "km") { need(ak, sub); need(am, 128); }
      if (m.layout == "kn") { need(ak, sub); need(an, 128); }
      if (m.layout == "nk") { need(an, sub); need(ak, 128); }
    }
    json extras = json::array(), extra_exprs = json::array(), extra_bytes = json::array(),
         extra_pooled = json::array();
    for (auto& op : prog.operands) {
      const std::string& nm = sig.input(op.input);
      extra_pooled.push_back(op.pooled);
      if (op.scalar) {
        extras.push_back(nullptr);
        extra_exprs.push_back(fmt::format("jnp.reshape(jnp.asarray({}), (1,)).astype(jnp.{})",
                                          nm, is_float_dtype(op.dtype) ? "float32" : "int32"));
        extra_bytes.push_back(0);
        continue;
      }
      bool ok = true;
      auto pr = pres3(op.present, ok);
      if (!ok)
        return std::nullopt;
      extras.push_back(pr);
      std::string shape = op.space_shape;
      if (n_split)  // (B, M, outer, inner) -> (B, M, outer * inner) or (B, M, inner)
        shape = fmt::format("({}, {}, {})", pr[0] ? space[0].extent_expr() : "1",
                            pr[1] ? space[1].extent_expr() : "1",
                            op.present[2] ? "N" : op.present[3] ? space[3].extent_expr() : "1");
      // bool blocks travel as int32 (Mosaic has no i1 memrefs)
      extra_exprs.push_back(fmt::format("jnp.reshape({}, {}){}", nm, shape,
                                        op.dtype == "bool" ? ".astype(jnp.int32)" : ""));
      if (n_split && !op.present[2] && op.present[3])
        extras.back().push_back("inner");  // one block along N for every column block
      extra_bytes.push_back(op.dtype == "bool" ? 4 : dtype_bytes(op.dtype));
      if (pr[1])
        need(am, sublane_align(op.dtype));
      if (pr[2])
        need(an, 128);
    }
    if (pool > 1)  // pooled output blocks lane-aligned: bn / pool a multiple of 128
      need(an, 128 * pool);
    json outputs = json::array();
    std::string result;
    for (size_t k = 0; k < prog.outputs.size(); ++k) {
      auto& o = prog.outputs[k];
      bool ok = true;
      auto pr = pres3(o.present, ok);
      if (!ok || (n_split && o.present[3] && !o.present[2]))
        return std::nullopt;
      outputs.push_back({pr, o.dtype});
      if (pr[1])
        need(am, sublane_align(o.dtype));
      if (pr[2])
        need(an, 128);
      result += (k ? ", " : "") + fmt::format("outs[{}].reshape({})", k, o.ref_shape);
    }
    result = prog.outputs.size() == 1 ? "    return " + result
                                      : "    return (" + result + ")";
    std::string mode = n_split        ? "group"
                       : prog.reduced[2] ? (prog.streamable ? "stream" : "row")
                                         : "tile";
    bool full_m = prog.reduced[1];
    // Group mode with lane-aligned groups (a norm per 128-wide head): a column block may hold
    // several whole groups, the epilogue running on each group's lane-aligned slice, so the
    // dot is as wide as the MXU instead of one group. Only when every output spans the groups
    // (a per-row output would be written once per group).
    bool group_blocks = false;
    if (n_split && space[3].extent() % 128 == 0 && space[2].extent() > 1) {
      group_blocks = true;
      for (auto& o : prog.outputs)
        group_blocks = group_blocks && o.present[3];
    }

    // Wrapper: sizes, canonical operands, extras.
    std::vector<std::string> bexprs = space[0].factor_exprs, mexprs = space[1].factor_exprs,
                             nexprs = space[2].factor_exprs;
    if (n_split)
      nexprs.push_back(space[3].factor_exprs[0]);
    std::string kexpr = k_exprs[0];
    if (k_exprs.size() > 1) {
      kexpr = "(";
      for (auto& e : k_exprs)
        kexpr += e + ", ";
      kexpr += ")";
    }
    std::string prep = fmt::format("    B, M, N, K = {}, {}, {}, {}\n", product_expr(bexprs),
                                   product_expr(mexprs), product_expr(nexprs), kexpr);
    prep += "    mats = [\n";
    for (size_t i = 0; i < mats.size(); ++i) {
      const auto& m = mats[i];
      std::string k = k_exprs.size() > 1 ? fmt::format("K[{}]", mat_segment[i]) : "K";
      std::string shape = m.layout == "mk"   ? "(B, M, " + k + ")"
                          : m.layout == "km" ? "(B, " + k + ", M)"
                          : m.layout == "kn" ? "(B, " + k + ", N)"
                                             : "(B, N, " + k + ")";
      prep += fmt::format("        jnp.reshape({}, {}),\n", sig.input(m.input), shape);
    }
    prep += "    ]\n";
    prep += "    NI = " + (n_split ? space[3].extent_expr() : std::string("None")) + "\n";
    prep += "    extras = [\n";
    for (auto& e : extra_exprs)
      prep += "        " + e.get<std::string>() + ",\n";
    prep += "    ]";

    // fp8 x fp8 dots run as bf16 (exact, every chip) or natively on chips with fp8 MXUs.
    bool fp8 = true;
    for (size_t d = 0; d < dots.size(); ++d)
      fp8 = fp8 && lhs[d].operand_dtype.rfind("float8", 0) == 0 &&
            rhs[d].operand_dtype.rfind("float8", 0) == 0;
    json mat_layouts = json::array(), casts = json::array(), mat_dtypes = json::array(),
         native_casts = json::array();
    for (auto& m : mats) {
      mat_layouts.push_back(m.layout);
      casts.push_back(m.casts);
      mat_dtypes.push_back(m.dtype);
      bool plain = m.dtype.rfind("float8", 0) == 0 && m.casts.size() == 1 &&
                   m.casts[0] == "bfloat16";
      native_casts.push_back(plain ? std::vector<std::string>{} : m.casts);
    }
    // One f32 product whose output block is the product itself (before the epilogue) and
    // stays put along K: accumulate into that block, no scratch copy of it.
    bool acc_in_out = (mode == "row" || mode == "tile") && dots.size() == 1 &&
                      outputs.size() == 1 && pool == 1 && !int_dot &&
                      outputs[0][0][1].get<bool>() && outputs[0][0][2].get<bool>() &&
                      outputs[0][1] == "float32";
    // Row mode's epilogue may run on a few rows at a time (row_pieces below) when every row
    // is independent: no reduction over M, every output per row, no pooling.
    bool pieces = mode == "row" && pool == 1 && !full_m;
    for (const auto& o : outputs)
      pieces = pieces && o[0][1].get<bool>();
    json stream_accs = json::array();
    if (mode == "stream")
      for (auto& d : prog.accumulator_dtypes)
        stream_accs.push_back(d);

    template_match tm;
    tm.family = name();
    std::string eltype = g.dtype(lhs0) + " x " + g.dtype(rhs0);
    std::string prims;
    for (auto& p : prog.primitives)
      prims += (prims.empty() ? "" : " ") + p;
    tm.summary = fmt::format(
        "{} dot(s) B={} M={} N={} K={} ({} {}{}), epilogue [{}] in {} mode{}{}{}", dots.size(),
        space[0].extent(), space[1].extent(),
        space[2].extent() * (n_split ? space[3].extent() : 1), k0, lhs[0].layout,
        rhs[0].layout, ", " + eltype, prims.empty() ? "none" : prims, mode,
        full_m ? ", whole columns of M per block" : "",
        pool > 1 ? fmt::format(", output {} by {} along N",
                               pool_outer ? "sliced into members" : "pooled", pool)
                 : "",
        k_exprs.size() > 1 ? fmt::format(", {} contractions in turn", k_exprs.size()) : "");
    json config = {{"mode", mode},
                   {"full_m", full_m},
                   {"align", {am, an, ak}},
                   {"dots", dot_list},
                   {"mat_layouts", mat_layouts},
                   {"casts", casts},
                   {"fp8", fp8},
                   {"native_casts", native_casts},
                   {"extras", extras},
                   {"outputs", outputs},
                   {"acc_dtype", int_dot ? "int32" : "float32"},
                   {"acc_in_out", acc_in_out},
                   {"row_pieces", pieces},
                   {"stream_accs", stream_accs},
                   {"pool", pool},
                   {"pool_outer", pool_outer},
                   {"extra_pooled", extra_pooled},
                   {"group_blocks", group_blocks},
                   {"mat_segments", mat_segment},
                   {"transcendentals", prog.transcendentals}};
    std::string code = prog.code;
    if (mode == "stream")
      code += "\n\n" + prog.stream_code;
    tm.facts = {{"signature", signature_facts(sig)},
                {"config", config},
                {"epilogue", code},
                {"prep", prep},
                {"result", result},
                {"sizes", {{"B", space[0].extent()}, {"M", space[1].extent()},
                           {"N", space[2].extent() * (n_split ? space[3].extent() : 1)},
                           {"NI", n_split ? space[3].extent() : 0}, {"K", k0}}},
                {"mat_dtypes", mat_dtypes},
                {"extra_bytes", extra_bytes},
                {"refusal_stream", prog.stream_refusal}};
    tm.score = 1.0;
    return tm;
  }

  // Effective blocks at configuration 0.
  struct blocks {
    int64_t bm, bn, bk;
  };
  blocks effective(const template_match& m, const json& params) const {
    const auto& c = m.facts["config"];
    const auto& s = m.facts["sizes"];
    int64_t M = s["M"], N = s["N"], K = s["K"];
    auto get = [&](const char* k, int64_t d) {
      return params.contains(k) && params[k].is_number() ? params[k].get<int64_t>() : d;
    };
    blocks b;
    b.bm = c["full_m"].get<bool>() ? M : effective_block(M, c["align"][0], get("block_m", 512));
    int64_t ni = s["NI"].get<int64_t>();
    b.bn = c["mode"] == "row" ? N
           : c["mode"] == "group"
               ? (c.value("group_blocks", false)
                      ? effective_block(N, ni, std::max(ni, get("block_n", ni)))
                      : ni)
               : effective_block(N, c["align"][1], get("block_n", 512));
    b.bk = effective_block(K, c["align"][2], get("block_k", 512));
    return b;
  }

  // Row mode's pieces (matmul.py): the dot runs in column slices, the epilogue on a few rows
  // at a time, each the largest aligned divisor whose f32 slice is at most kPieceBytes
  // unless the params set it; other modes run both on the whole block.
  static constexpr int64_t kPieceBytes = int64_t{4} << 20;
  struct pieces {
    int64_t rows, cols;
  };
  pieces row_pieces(const template_match& m, const json& params, const blocks& b) const {
    const auto& c = m.facts["config"];
    if (!c.value("row_pieces", false))
      return {b.bm, b.bn};
    auto want = [&](const char* k, int64_t d) {
      return params.contains(k) && params[k].is_number_integer() ? params[k].get<int64_t>() : d;
    };
    int64_t am = c["align"][0];
    int64_t rows = want("epilogue_rows", std::max(am, kPieceBytes / (4 * b.bn)));
    int64_t cols = want("dot_cols", std::max<int64_t>(128, kPieceBytes / (4 * b.bm)));
    return {effective_block(b.bm, am, rows), effective_block(b.bn, 128, cols)};
  }

  int64_t vmem_bytes(const template_match& m, const json& params) const override {
    const auto& c = m.facts["config"];
    auto b = effective(m, params);
    int64_t io = 0;
    const auto& layouts = c["mat_layouts"];
    for (size_t i = 0; i < layouts.size(); ++i) {
      std::string l = layouts[i], dt = m.facts["mat_dtypes"][i];
      if (l == "mk") io += tile_bytes(b.bm, b.bk, dt);
      if (l == "km") io += tile_bytes(b.bk, b.bm, dt);
      if (l == "kn") io += tile_bytes(b.bk, b.bn, dt);
      if (l == "nk") io += tile_bytes(b.bn, b.bk, dt);
    }
    for (size_t i = 0; i < c["extras"].size(); ++i) {
      const auto& pres = c["extras"][i];
      if (pres.is_null())
        continue;
      int bytes = m.facts["extra_bytes"][i];
      std::string dt = bytes == 2 ? "bfloat16" : bytes == 1 ? "int8" : "float32";
      bool inner = pres.size() > 3;  // one group, whichever column block
      io += tile_bytes(pres[1].get<bool>() ? b.bm : 1,
                       pres[2].get<bool>() ? (inner ? m.facts["sizes"]["NI"].get<int64_t>() : b.bn) : 1,
                       dt);
    }
    int64_t pool = c.value("pool", int64_t{1});
    for (const auto& o : c["outputs"]) {
      const auto& pres = o[0];
      io += tile_bytes(pres[1].get<bool>() ? b.bm : 1, pres[2].get<bool>() ? b.bn / pool : 1,
                       o[1]);
    }
    int64_t ndots = static_cast<int64_t>(c["dots"].size());
    int64_t acc = c.value("acc_in_out", false) ? 0 : ndots * tile_bytes(b.bm, b.bn, "float32");
    int64_t stats = static_cast<int64_t>(c["stream_accs"].size()) * tile_bytes(b.bm, 1, "float32");
    // The dot's result before it is added and the epilogue's temporaries: an f32 tile each
    // (of a piece in row mode); blocks cast before the dot (int8 / fp8 weights) take a
    // converted copy.
    auto pc = row_pieces(m, params, b);
    int64_t temps = tile_bytes(b.bm, pc.cols, "float32") + tile_bytes(pc.rows, b.bn, "float32");
    const auto& casts = params.value("fp8_mxu", "") == "native" ? c["native_casts"] : c["casts"];
    for (size_t i = 0; i < layouts.size(); ++i)
      if (!casts[i].empty()) {
        std::string l = layouts[i];
        int64_t rows = l[0] == 'm' ? b.bm : l[0] == 'n' ? b.bn : b.bk;
        int64_t cols = l[1] == 'm' ? b.bm : l[1] == 'n' ? b.bn : b.bk;
        temps += tile_bytes(rows, cols, casts[i].back());
      }
    return 2 * io + acc + stats + temps;
  }

  // Modeled cost of a choice of blocks (for the first candidate only): the longer of MXU
  // time and HBM time for the operand traffic its grid order causes, plus per-step overhead.
  double rough_cost(const template_match& m, const json& p, const config::chip& chip) const {
    const auto& c = m.facts["config"];
    const auto& s = m.facts["sizes"];
    double B = s["B"], M = s["M"], N = s["N"], K = s["K"];
    auto b = effective(m, p);
    double nm = M / static_cast<double>(b.bm), nn = N / static_cast<double>(b.bn),
           nk = K / static_cast<double>(b.bk);
    bool n_major = p.value("grid_order", "m_major") == "n_major";
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < c["mat_layouts"].size(); ++i) {
      std::string l = c["mat_layouts"][i];
      double bytes = B * (l[0] == 'm' || l[1] == 'm' ? M : N) * K *
                     dtype_bytes(m.facts["mat_dtypes"][i]);
      bool is_lhs = l == "mk" || l == "km";
      // A block is fetched again whenever its index changes between consecutive steps.
      double rereads = is_lhs ? (n_major ? nn : (nk > 1 ? nn : 1.0))
                              : (n_major ? (nk > 1 ? nm : 1.0) : ((nk > 1 || nn > 1) ? nm : 1.0));
      (is_lhs ? lhs : rhs) += bytes * rereads;
    }
    double out = 0, pool = c.value("pool", 1.0);
    for (const auto& o : c["outputs"])
      out += B * (o[0][1].get<bool>() ? M : 1) * (o[0][2].get<bool>() ? N / pool : 1) *
             dtype_bytes(o[1]);
    double bw = chip.hbm_bandwidth > 0 ? chip.hbm_bandwidth * chip.device_share() : 1e12;
    double flops = chip.bf16_flops > 0 ? chip.bf16_flops * chip.device_share() : 1e14;
    double mxu = std::max<double>(128, chip.mxu_size);
    auto pad = [&](double x) { return std::ceil(x / mxu) * mxu; };
    // Member-outer blocks run one dot per member, each bn / pool wide on the MXU.
    double members = c.value("pool_outer", false) ? c.value("pool", 1.0) : 1.0;
    double cols = members * pad(static_cast<double>(b.bn) / members);
    double compute = 2 * B * nm * nn * nk * pad(b.bm) * cols * pad(b.bk) *
                     static_cast<double>(c["dots"].size()) / flops;
    double memory = (lhs + rhs + out) / bw;
    double steps = B * nm * nn * nk;
    return std::max(compute, memory) + steps * 0.35e-6;
  }

  json initial_params(const template_match& m, const config::chip& chip) const override {
    const auto& c = m.facts["config"];
    const auto& s = m.facts["sizes"];
    std::string mode = c["mode"];
    int64_t scoped = static_cast<int64_t>(chip.scoped_vmem_bytes);
    int64_t physical = static_cast<int64_t>(chip.vmem_bytes);
    // Production kernels raise the scoped limit (48-100 MiB on 128 MiB chips): allow half the
    // core's VMEM, at most 64 MiB, and never less than 3/4 of the default.
    int64_t budget = std::max(scoped * 3 / 4, std::min(physical / 2, int64_t{64} << 20));
    std::vector<int64_t> ms = {2048, 1024, 512, 256, 128, 64, 32, 16, 8};
    std::vector<int64_t> ns = {4096, 2048, 1024, 512, 256, 128};
    std::vector<int64_t> ks = {s["K"].get<int64_t>(), 4096, 2048, 1024, 512, 256, 128};
    std::vector<std::string> orders = {"m_major"};
    if (mode == "tile")
      orders.push_back("n_major");
    json best;
    double best_cost = 0;
    for (const auto& order : orders)
      for (int64_t bm : ms)
        for (int64_t bn : (mode == "row" || (mode == "group" && !c.value("group_blocks", false))
                               ? std::vector<int64_t>{512}
                               : ns))
          for (int64_t bk : ks) {
            json p = {{"block_m", bm}, {"block_n", bn}, {"block_k", bk}};
            if (mode == "tile")
              p["grid_order"] = order;
            if (vmem_bytes(m, p) > budget)
              continue;
            double cost = rough_cost(m, p, chip);
            if (best.is_null() || cost < best_cost * 0.999) {
              best = p;
              best_cost = cost;
            }
          }
    if (best.is_null()) {  // nothing fits the budget: the smallest aligned blocks
      best = {{"block_m", c["align"][0]}, {"block_n", c["align"][1]}, {"block_k", c["align"][2]}};
      if (mode == "tile")
        best["grid_order"] = "m_major";
    }
    int64_t need = vmem_bytes(m, best);
    if (c["fp8"].get<bool>())
      best["fp8_mxu"] = chip.fp8_flops > 0 ? "native" : "bf16";
    best["dimension_semantics"] = "parallel";
    best["vmem_limit_bytes"] =
        need > scoped * 3 / 4
            ? std::min<int64_t>(physical * 7 / 8, round_up(need * 5 / 4, int64_t{1} << 20))
            : scoped;
    return best;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    const auto& c = m.facts["config"];
    const auto& s = m.facts["sizes"];
    std::string mode = c["mode"];
    std::vector<tunable> ts;
    if (!c["full_m"].get<bool>())
      ts.push_back({"block_m", tunable::kind::block, s["M"], c["align"][0], 1, 0, false, {},
                    "rows of the output per block"});
    if (mode != "row" && mode != "group")
      ts.push_back({"block_n", tunable::kind::block, s["N"], c["align"][1], 2, 0,
                    mode == "stream", {},
                    mode == "stream" ? "columns per block (row statistics carried across)"
                                     : "columns of the output per block"});
    if (mode == "group" && c.value("group_blocks", false))
      ts.push_back({"block_n", tunable::kind::block, s["N"], s["NI"], 2, 0, false, {},
                    "columns of the output per block: whole groups, each normalised on its "
                    "own lane-aligned slice"});
    ts.push_back({"block_k", tunable::kind::block, s["K"], c["align"][2], 3, 0, true, {},
                  "contracted elements accumulated per grid step"});
    if (mode == "tile")
      ts.push_back({"grid_order", tunable::kind::choice, 0, 1, -1, 0, false,
                    {"m_major", "n_major"},
                    "row blocks outside (rhs re-read per row block) or inside (lhs re-read)"});
    ts.push_back({"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
                  {"parallel", "arbitrary"},
                  "output blocks split across megacore TensorCores (parallel) or run in order"});
    if (c["fp8"].get<bool>())
      ts.push_back({"fp8_mxu", tunable::kind::choice, 0, 1, -1, 0, false, {"native", "bf16"},
                    "fp8 blocks fed to the MXU as they are, or converted to bf16 (exact)"});
    ts.push_back({"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {},
                  "scoped VMEM limit"});
    return ts;
  }

  bool render(const template_match& m, const json& params, std::string& source,
              std::string& error) const override {
    for (const char* k : {"block_m", "block_n", "block_k"})
      if (!params.contains(k) || !params[k].is_number_integer() || params[k].get<int64_t>() < 1) {
        error = std::string("param ") + k + " must be a positive integer";
        return false;
      }
    for (const char* k : {"epilogue_rows", "dot_cols"})
      if (params.contains(k) &&
          (!params[k].is_number_integer() || params[k].get<int64_t>() < 1)) {
        error = std::string("param ") + k + " must be a positive integer";
        return false;
      }
    if (params.contains("grid_order") && params["grid_order"] != "m_major" &&
        params["grid_order"] != "n_major") {
      error = "param grid_order must be m_major or n_major";
      return false;
    }
    if (params.contains("dimension_semantics") && params["dimension_semantics"] != "parallel" &&
        params["dimension_semantics"] != "arbitrary") {
      error = "param dimension_semantics must be parallel or arbitrary";
      return false;
    }
    if (params.contains("fp8_mxu") && params["fp8_mxu"] != "native" &&
        params["fp8_mxu"] != "bf16") {
      error = "param fp8_mxu must be native or bf16";
      return false;
    }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number() ||
        params["vmem_limit_bytes"].get<double>() <= 0) {
      error = "param vmem_limit_bytes must be a positive number";
      return false;
    }
    const auto& f = m.facts;
    // The pieces the VMEM estimate assumed, written into the kernel's PARAMS.
    json shown = params;
    auto b = effective(m, params);
    auto pc = row_pieces(m, params, b);
    if (pc.rows < b.bm || pc.cols < b.bn) {
      shown["epilogue_rows"] = pc.rows;
      shown["dot_cols"] = pc.cols;
    }
    return fill_template("matmul.py",
                         {{"header", header_comment(name(), m.summary, shown.dump())},
                          {"params", python_literal(shown)},
                          {"config", python_literal(f["config"])},
                          {"epilogue", f["epilogue"].get<std::string>()},
                          {"args", f["signature"]["args"].get<std::string>()},
                          {"prep", f["prep"].get<std::string>()},
                          {"result", f["result"].get<std::string>()}},
                         source, error);
  }
};

}  // namespace

template_ptr make_matmul_template() { return std::make_shared<matmul_template>(); }

}  // namespace maxkernel::agents::expert
