// The paged_attention family: attention whose keys and values are gathered from a page pool
// through a page table (decode against a paged KV cache, vLLM / JetStream layout), computed
// without materialising the gathered cache: the table (and the lengths) go to SMEM by scalar
// prefetch, each grid step copies a block of pages from HBM into VMEM by DMA (the next
// block's copies start before the current one is used), and key blocks the mask kills
// (positions past a sequence's length) are neither copied nor computed.
// Recognised: K = reshape(gather(pool, table[...])) with the table indexing one pool axis,
// full slices of the others, the page's rows and the head dimension its last two axes; V
// the same; one query-key product; the score function as in flash_attention. Refused
// otherwise (ragged multi-sequence layouts with per-token loops, strided K/V in one pool).
#include "agents/expert/attention_codegen.hpp"
#include "agents/expert/attention_pattern.hpp"
#include "agents/expert/block_size.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/template_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace maxkernel::agents::expert {

namespace {

std::vector<int> ints(const nlohmann::json& j) {
  std::vector<int> out;
  if (j.is_array())
    for (const auto& x : j)
      if (x.is_number_integer())
        out.push_back(x.get<int>());
  return out;
}

bool has(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::string tuple_ints(const std::vector<int>& v) {
  if (v.empty())
    return "()";
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

// A page pool read through a page table: K or V of a paged cache.
struct page_pool {
  int pool_input = -1;
  int page_axis = -1;
  axis_indices pool_axes;    // per pool axis (empty for the page axis)
  int table_input = -1;
  axis_indices table_axes;
  std::vector<int> gather_nodes;  // the gather and the index plumbing
};

// The page table behind the gather's indices: broadcasts/reshapes adding the index-vector
// axis, casts, and jnp's negative-index wrap select_n(i < 0, i, i + n).
std::optional<std::pair<int, axis_indices>> trace_table(const graph_view& g,
                                                        loop_index_space& space, value_ref v,
                                                        axis_indices axes,
                                                        std::vector<int>& nodes) {
  while (v.is_node()) {
    int id = v.id;
    auto p = g.primitive(id);
    nodes.push_back(id);
    if (is_layout_primitive(p) || p == "convert_element_type") {
      auto ops = operand_indices(g, space, id, 0, axes);
      if (!ops)
        return std::nullopt;
      axes = *ops;
      v = g.operand(id, 0);
      continue;
    }
    if (p == "select_n" && g.operand_count(id) == 3) {
      auto a = g.operand(id, 1), b = g.operand(id, 2);
      if (b.is_node() && g.primitive(b.id) == "add" &&
          ((g.operand(b.id, 0).what == a.what && g.operand(b.id, 0).id == a.id) ||
           (g.operand(b.id, 1).what == a.what && g.operand(b.id, 1).id == a.id))) {
        nodes.push_back(b.id);
        auto pred = g.operand(id, 0);
        if (pred.is_node())
          nodes.push_back(pred.id);
        v = a;
        continue;
      }
    }
    return std::nullopt;
  }
  if (!v.is_input())
    return std::nullopt;
  return std::make_pair(v.id, space.expand(axes));
}

std::optional<page_pool> read_pool(const graph_view& g, attention_pattern& p,
                                   const traced_operand& t, std::string& why) {
  if (!t.base.is_node() || g.primitive(t.base.id) != "gather") {
    why = "keys or values do not come from a gather";
    return std::nullopt;
  }
  int gn = t.base.id;
  const auto& params = g.params(gn);
  const auto& dn = params.value("dimension_numbers", nlohmann::json::object());
  auto offset = ints(dn.value("offset_dims", nlohmann::json()));
  auto collapsed = ints(dn.value("collapsed_slice_dims", nlohmann::json()));
  auto start_map = ints(dn.value("start_index_map", nlohmann::json()));
  auto op_batch = ints(dn.value("operand_batching_dims", nlohmann::json()));
  auto slice = ints(params.value("slice_sizes", nlohmann::json()));
  auto pool_shape = to_vector(g.node(gn).getOperands()[0].getShape());
  auto idx_shape = to_vector(g.node(gn).getOperands()[1].getShape());
  if (collapsed.size() != 1 || start_map != collapsed || !op_batch.empty() ||
      slice.size() != pool_shape.size() || idx_shape.empty() || idx_shape.back() != 1) {
    why = "the gather is not a page lookup";
    return std::nullopt;
  }
  page_pool pool;
  pool.page_axis = collapsed[0];
  for (size_t a = 0; a < pool_shape.size(); ++a) {
    bool page = static_cast<int>(a) == pool.page_axis;
    if ((page && slice[a] != 1) || (!page && slice[a] != pool_shape[a])) {
      why = "the gather takes partial slices";
      return std::nullopt;
    }
  }
  auto out_axes = t.axes;
  if (offset.size() + idx_shape.size() - 1 != out_axes.size()) {
    why = "gather rank mismatch";
    return std::nullopt;
  }
  pool.pool_axes.assign(pool_shape.size(), {});
  size_t oi = 0;
  for (size_t a = 0; a < pool_shape.size(); ++a) {
    if (static_cast<int>(a) == pool.page_axis)
      continue;
    pool.pool_axes[a] = out_axes[static_cast<size_t>(offset[oi++])];
  }
  axis_indices idx_axes;
  for (size_t a = 0; a < out_axes.size(); ++a)
    if (!has(offset, static_cast<int>(a)))
      idx_axes.push_back(out_axes[a]);
  idx_axes.push_back({});  // the index-vector axis
  auto pool_in = g.operand(gn, 0);
  if (!pool_in.is_input()) {
    why = "the page pool is computed";
    return std::nullopt;
  }
  pool.pool_input = pool_in.id;
  auto table = trace_table(g, p.space, g.operand(gn, 1), idx_axes, pool.gather_nodes);
  if (!table) {
    why = "the page indices do not come from an input table";
    return std::nullopt;
  }
  pool.table_input = table->first;
  pool.table_axes = table->second;
  pool.gather_nodes.push_back(gn);
  return pool;
}

bool contains(const index_list& l, int x) { return std::find(l.begin(), l.end(), x) != l.end(); }

// Checks a pool's layout and writes its index descriptor: per pool axis ("c", i), ("page",)
// or ("slice",) (the page's rows and the lanes: its last two axes).
bool pool_descriptor(const attention_pattern& p, const attention_codegen& cg,
                     const page_pool& pool, const index_list& lane, std::string& desc,
                     std::string& why) {
  int kp = p.keys[0], kt = p.keys[1];
  size_t n = pool.pool_axes.size();
  if (n < 3) {
    why = "page pool of rank < 3";
    return false;
  }
  if (pool.pool_axes[n - 2] != index_list{kt} || pool.pool_axes[n - 1] != lane) {
    why = "the page pool's last two axes are not (page rows, head dim)";
    return false;
  }
  std::vector<std::string> parts;
  for (size_t a = 0; a + 2 < n; ++a) {
    if (static_cast<int>(a) == pool.page_axis) {
      parts.push_back("(\"page\",)");
      continue;
    }
    const auto& l = pool.pool_axes[a];
    if (l.empty()) {
      parts.push_back("(\"zero\",)");
    } else if (l.size() == 1 && cg.c_axis(l[0]) >= 0) {
      parts.push_back(fmt::format("(\"c\", {})", cg.c_axis(l[0])));
    } else {
      why = "a page pool axis that is not a kv row";
      return false;
    }
  }
  if (pool.page_axis >= static_cast<int>(n) - 2) {
    why = "the page axis is one of the pool's last two";
    return false;
  }
  (void)kp;
  desc = "[" + [&] {
    std::string s;
    for (size_t i = 0; i < parts.size(); ++i)
      s += (i ? ", " : "") + parts[i];
    return s;
  }() + "]";
  return true;
}

// The table flattened as (kv rows it depends on, in grid order..., page slot).
bool table_view(const attention_pattern& p, const attention_codegen& cg, const page_pool& pool,
                const std::string& var, std::string& code, std::vector<int>& table_c,
                std::string& why) {
  int kp = p.keys[0];
  index_list leaves;
  for (const auto& a : pool.table_axes)
    leaves.insert(leaves.end(), a.begin(), a.end());
  if (!contains(leaves, kp)) {
    why = "the page table has no page-slot axis";
    return false;
  }
  std::vector<std::pair<int, int>> cs;
  for (int l : leaves) {
    if (l == kp)
      continue;
    int c = cg.c_axis(l);
    if (c < 0) {
      why = "the page table varies along a non-kv index";
      return false;
    }
    cs.push_back({c, l});
  }
  std::sort(cs.begin(), cs.end());
  index_list order;
  for (auto [c, l] : cs) {
    order.push_back(l);
    table_c.push_back(c);
  }
  order.push_back(kp);
  code = var + " = " + cg.arg(pool.table_input) + "\n";
  if (order != leaves) {
    std::vector<std::string> shape, perm;
    for (int l : leaves)
      shape.push_back(cg.size_of(l));
    for (int l : order)
      perm.push_back(std::to_string(std::find(leaves.begin(), leaves.end(), l) - leaves.begin()));
    auto tup = [](const std::vector<std::string>& v) {
      std::string s = "(";
      for (size_t i = 0; i < v.size(); ++i)
        s += (i ? ", " : "") + v[i];
      return s + (v.size() == 1 ? ",)" : ")");
    };
    code += fmt::format("{0} = jnp.transpose({0}.reshape({1}), {2})\n", var, tup(shape), tup(perm));
  }
  code += fmt::format("{0} = {0}.reshape(-1).astype(jnp.int32)\n", var);
  return true;
}

class paged_attention_template final : public kernel_template {
public:
  std::string name() const override { return "paged_attention"; }

  std::string covers() const override {
    return "attention over a paged KV cache (page table and lengths in SMEM by scalar prefetch, "
           "pages copied by DMA, blocks past the length skipped): decode and chunked prefill";
  }

  std::optional<template_match> match(const graph_view& graph,
                                      schema::KernelSpec::Reader spec) const override {
    std::string why;
    auto p = find_attention(graph, why);
    if (!p || p->keys.size() != 2 || p->terms.size() != 1)
      return std::nullopt;
    auto kpool = read_pool(graph, *p, p->terms[0].k, why);
    auto vpool = read_pool(graph, *p, p->v, why);
    if (!kpool || !vpool)
      return std::nullopt;
    // re-expand: reading the pools may have refined indices
    auto& pp = *p;
    for (auto* pool : {&*kpool, &*vpool}) {
      pool->pool_axes = pp.space.expand(pool->pool_axes);
      pool->table_axes = pp.space.expand(pool->table_axes);
    }
    std::vector<int> extra = kpool->gather_nodes;
    extra.insert(extra.end(), vpool->gather_nodes.begin(), vpool->gather_nodes.end());
    attention_codegen cg(graph, pp, spec);
    cg.add_known_nodes(extra);
    std::vector<std::pair<std::string, axis_indices>> sources;
    auto configs = spec.getConfigurations();
    if (configs.size() == 0)
      return std::nullopt;
    // workload parameter names of graph inputs (a<spec position>)
    std::vector<int> spec_index;
    auto inputs = configs[0].getInputs();
    for (unsigned i = 0; i < inputs.size(); ++i)
      if (!inputs[i].getIsStatic())
        spec_index.push_back(static_cast<int>(i));
    auto argname = [&](int in) {
      return in >= 0 && static_cast<size_t>(in) < spec_index.size()
                 ? "a" + std::to_string(spec_index[static_cast<size_t>(in)])
                 : std::string("None");
    };
    for (auto* pool : {&*kpool, &*vpool}) {
      sources.push_back({argname(pool->pool_input), pool->pool_axes});
      sources.push_back({argname(pool->table_input), pool->table_axes});
    }
    cg.set_external_kv(sources);
    if (!cg.build(why))
      return std::nullopt;
    index_list k_lane, v_lane;
    for (const auto& a : kpool->pool_axes)
      for (int l : a)
        if (contains(pp.terms[0].contraction, l))
          k_lane.push_back(l);
    for (const auto& a : vpool->pool_axes)
      for (int l : a)
        if (contains(pp.value_dims, l))
          v_lane.push_back(l);
    // the query's lane order must be the pool's (the dot contracts them as laid out)
    index_list q_lane;
    for (const auto& a : pp.terms[0].q.axes)
      for (int l : a)
        if (contains(pp.terms[0].contraction, l))
          q_lane.push_back(l);
    if (q_lane != k_lane)
      return std::nullopt;
    std::string kdesc, vdesc, ktab, vtab;
    std::vector<int> ktc, vtc;
    if (!pool_descriptor(pp, cg, *kpool, k_lane, kdesc, why) ||
        !pool_descriptor(pp, cg, *vpool, v_lane, vdesc, why) ||
        !table_view(pp, cg, *kpool, "ktab", ktab, ktc, why) ||
        !table_view(pp, cg, *vpool, "vtab", vtab, vtc, why))
      return std::nullopt;
    template_match m;
    m.family = name();
    m.summary = "paged " + cg.summary() + fmt::format(", pages of {} rows", pp.space.size(pp.keys[1]));
    m.facts = cg.facts();
    m.facts["page"] = pp.space.size(pp.keys[1]);
    m.facts["pages_per_seq"] = pp.space.size(pp.keys[0]);
    m.facts["qk_dim"] = cg.qk_dims()[0];
    // several kv heads per step: the pools are indexed by the head axis and the page tables
    // are not (each head's pages are the sequence's)
    int head = cg.head_axis();
    auto pool_has = [&](const std::string& desc) {
      return desc.find(fmt::format("(\"c\", {})", head)) != std::string::npos;
    };
    if (head >= 0 && !(pool_has(kdesc) && pool_has(vdesc) && !contains(ktc, head) &&
                       !contains(vtc, head)))
      head = -1;
    m.facts["head_axis"] = head;
    // the workload
    std::string body = cg.prologue_code() + cg.sizes_code() + cg.functions();
    const auto& q = cg.q_views()[0];
    body += q.code + ktab + vtab;
    std::string tiles = "[", scalars = "[";
    for (const auto& tv : cg.tile_views()) {
      body += tv.code;
      tiles += fmt::format("({}, {}), ", tv.var, tv.axes);
    }
    for (size_t i = 0; i < cg.scalar_views().size(); ++i) {
      body += cg.scalar_views()[i].code;
      scalars += fmt::format("({}, {}), ", cg.scalar_views()[i].var, tuple_ints(cg.scalar_c()[i]));
    }
    tiles += "]";
    scalars += "]";
    body += fmt::format(
        "o = _paged(\n    ({}, {}, _pre_q0),\n    ({}, {}, ktab, {}, _pre_k0),\n"
        "    ({}, {}, vtab, {}, _pre_v),\n    {},\n    {},\n"
        "    c_sizes={}, rows={}, keys={}, page={},\n    out_shape={}, out_axes={}, out_dtype=\"{}\",\n"
        "    dot_dtype=\"{}\", s_dtype=\"{}\",\n"
        "    score=_score, kill={}, kill_static={}, kill_c={}, kill_rows={}, row_align={},\n"
        "    head_axis={})\n",
        q.var, q.axes, argname(kpool->pool_input), kdesc, tuple_ints(ktc),
        argname(vpool->pool_input), vdesc, tuple_ints(vtc), tiles, scalars, cg.c_sizes(),
        cg.rows_size(), cg.keys_size(), cg.size_of(pp.keys[1]), cg.out_view().shape,
        cg.out_view().axes, pp.out_dtype, cg.term_dtypes()[0].first, cg.term_dtypes()[0].second,
        cg.has_kill() ? "_kill" : "None", cg.kill_static() ? "True" : "False",
        tuple_ints(cg.kill_c()), cg.kill_rows() ? "True" : "False", cg.row_align(), head);
    body += cg.out_view().code;
    body += cg.epilogue_code();
    body += "return " + cg.result() + "\n";
    m.facts["generated"] =
        cg.module_code() + "def workload(" + cg.signature() + "):\n    " + indent(body, 4) + "\n";
    m.score = 3.0;  // more specific than flash_attention (which refuses split keys anyway)
    return m;
  }

  nlohmann::json initial_params(const template_match& m,
                                const config::chip& chip) const override {
    nlohmann::json params = {{"pages_per_block", 128}, {"block_q", 256},
                             {"pv_dtype", default_pv_dtype(m)},
                             {"row_semantics", "parallel"},
                             {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
    if (m.facts.value("head_axis", -1) >= 0)
      params["block_h"] = 1;
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes * 0.6);
    while (vmem_bytes(m, params) > budget && params["pages_per_block"].get<int64_t>() > 1)
      params["pages_per_block"] = params["pages_per_block"].get<int64_t>() / 2;
    return params;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    int nc = static_cast<int>(m.facts["kv_rows"].size());
    std::vector<tunable> t;
    tunable pb;
    pb.name = "pages_per_block";
    pb.what = tunable::kind::block;
    pb.extent = m.facts["pages_per_seq"];
    pb.align = 1;
    pb.grid_axis = nc + 1;
    pb.reduction = true;
    pb.meaning = "pages copied and attended per grid step";
    t.push_back(pb);
    tunable bq;
    bq.name = "block_q";
    bq.what = tunable::kind::block;
    bq.extent = m.facts["rows"];
    bq.align = m.facts["row_align"];
    bq.grid_axis = nc;
    bq.meaning = "query rows per block";
    t.push_back(bq);
    if (auto bh = heads_tunable(m.facts))
      t.push_back(*bh);
    tunable pv;
    pv.name = "pv_dtype";
    pv.what = tunable::kind::choice;
    pv.choices = {"bfloat16", "float32"};
    pv.meaning = "operand dtype of the P @ V matmul (f32 accumulation either way)";
    t.push_back(pv);
    tunable sem;
    sem.name = "row_semantics";
    sem.what = tunable::kind::choice;
    sem.choices = {"parallel", "arbitrary"};
    sem.meaning = "dimension semantics of the kv-row and row-block grid axes";
    t.push_back(sem);
    tunable vl;
    vl.name = "vmem_limit_bytes";
    vl.what = tunable::kind::choice;
    for (int64_t mib : {16, 32, 48, 64, 96})
      vl.choices.push_back(mib * 1024 * 1024);
    vl.meaning = "scoped VMEM limit of the kernel";
    t.push_back(vl);
    return t;
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const override {
    const auto& f = m.facts;
    int64_t page = f.value("page", 16), pps = f.value("pages_per_seq", 1);
    int64_t ppb = effective_block(pps, 1, params.value("pages_per_block", 128));
    int64_t bk = ppb * page;
    int64_t bq = effective_block(f.value("rows", 1), f.value("row_align", 8),
                                 params.value("block_q", 256));
    int64_t d = f.value("qk_dim", 128), dv = f.value("value_dim", 128);
    int64_t qi = f.value("itemsize_q", 2), kvi = f.value("itemsize_kv", 2);
    int64_t oi = f.value("itemsize_out", 2), ti = f.value("tile_bytes", 0);
    int64_t buffers = 2 * bk * (d + dv) * kvi;                 // two slots of K and V pages
    int64_t blocks = 2 * (bq * d * qi + bq * dv * oi + bq * bk * ti);
    int64_t scratch = 2 * bq * 128 * 4 + bq * std::max<int64_t>(dv, 128) * 4;
    return heads_per_block(f, params) * (buffers + blocks + scratch + 3 * bq * bk * 4);
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    auto get_int = [&](const char* key, int64_t lo, int64_t hi, int64_t& out) {
      if (!params.contains(key) || !params[key].is_number_integer()) {
        error = fmt::format("parameter {} must be an integer", key);
        return false;
      }
      out = params[key].get<int64_t>();
      if (out < lo || out > hi) {
        error = fmt::format("parameter {} = {} is outside [{}, {}]", key, out, lo, hi);
        return false;
      }
      return true;
    };
    int64_t ppb, bq, bh = 1, vmem;
    if (params.contains("block_h") && !get_int("block_h", 1, 1 << 16, bh))
      return false;
    if (!get_int("pages_per_block", 1, 4096, ppb) || !get_int("block_q", 1, 1 << 16, bq) ||
        !get_int("vmem_limit_bytes", 1 << 20, int64_t(1) << 32, vmem))
      return false;
    std::string pv = params.value("pv_dtype", std::string());
    if (pv != "bfloat16" && pv != "float32") {
      error = "parameter pv_dtype must be \"bfloat16\" or \"float32\"";
      return false;
    }
    std::string sem = params.value("row_semantics", std::string());
    if (sem != "parallel" && sem != "arbitrary") {
      error = "parameter row_semantics must be \"parallel\" or \"arbitrary\"";
      return false;
    }
    std::string helpers;
    if (!fill_template("attention_helpers.py", {}, helpers, error))
      return false;
    return fill_template("paged_attention.py",
                         {{"summary", m.summary},
                          {"params", params.dump()},
                          {"pages_per_block", std::to_string(ppb)},
                          {"block_h", std::to_string(bh)},
                          {"block_q", std::to_string(bq)},
                          {"pv_dtype", pv},
                          {"vmem_limit_bytes", std::to_string(vmem)},
                          {"row_semantics", sem},
                          {"helpers", helpers},
                          {"generated", m.facts.value("generated", std::string())}},
                         source, error);
  }

private:
  static std::string default_pv_dtype(const template_match& m) {
    std::string vd = m.facts.value("v_storage_dtype", std::string("float32"));
    return (vd == "bfloat16" || vd == "float16") ? "bfloat16" : "float32";
  }
};

}  // namespace

template_ptr make_paged_attention_template() {
  return std::make_shared<paged_attention_template>();
}

}  // namespace maxkernel::agents::expert
