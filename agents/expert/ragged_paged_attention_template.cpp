// The ragged_paged_attention family: causal attention of a mixed batch of variable-length
// sequences (prefill chunks and decodes packed along one token axis, bounded by cu_q_lens)
// against a paged KV cache (vLLM TPU / JetStream layout): a page table per sequence, kv
// lengths per sequence, the number of active sequences; K and V interleaved along one
// combined-head axis of a single page pool.
// Recognised by the dataflow, whatever the spelling of the per-token loop: one page pool (a
// rank-4 input read by whole pages through a gather whose indices come from a rank-2 int
// table), K and V as two strided slices of the gathered pages along the combined-head axis,
// a query-key product with a query input of the output's shape, a softmax (exp) behind a
// select with -inf (the causal mask), a probabilities-values product, and int vectors of the
// table's row count (kv lengths), one more (query bounds) and a single count. The score
// scale is read from the graph (a literal factor of the scores or of the queries). Refused
// otherwise (the dense or per-sequence paged_attention family covers other layouts).
#include "agents/expert/block_size.hpp"
#include "agents/expert/graph_view.hpp"
#include "agents/expert/kernel_template.hpp"
#include "agents/expert/template_text.hpp"
#include "agents/expert/workload_signature.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace maxkernel::agents::expert {

namespace {

using json = nlohmann::json;

value_ref node_value(int id) {
  value_ref v;
  v.what = value_ref::kind::node;
  v.id = id;
  v.result = 0;
  return v;
}

bool is_float(const std::string& dtype) {
  return dtype.find("float") != std::string::npos;
}

bool is_int(const std::string& dtype) { return dtype.rfind("int", 0) == 0 || dtype.rfind("uint", 0) == 0; }

// Follows data-movement and casts upward (the spelling of views of one array).
value_ref skip_views(const graph_view& g, value_ref v) {
  static const std::set<std::string> views = {"reshape", "broadcast_in_dim", "transpose",
                                              "squeeze", "expand_dims", "convert_element_type",
                                              "copy", "copy_p"};
  while (v.is_node() && views.count(g.primitive(v.id)) && g.operand_count(v.id) >= 1)
    v = g.operand(v.id, 0);
  return v;
}

// True when `v` depends on node `target` (a walk over its producers).
bool depends_on(const graph_view& g, const value_ref& v, int target) {
  if (!v.is_node())
    return false;
  std::vector<int> stack{v.id};
  std::set<int> seen;
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (id == target)
      return true;
    if (!seen.insert(id).second || id < target)
      continue;  // producers come before consumers in graph order
    for (unsigned k = 0; k < g.operand_count(id); ++k) {
      auto o = g.operand(id, k);
      if (o.is_node())
        stack.push_back(o.id);
    }
  }
  return false;
}

// Graph inputs `v` is computed from.
std::set<int> upstream_inputs(const graph_view& g, const value_ref& v) {
  std::set<int> out;
  if (v.is_input()) {
    out.insert(v.id);
    return out;
  }
  if (!v.is_node())
    return out;
  std::vector<int> stack{v.id};
  std::set<int> seen;
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (!seen.insert(id).second)
      continue;
    for (unsigned k = 0; k < g.operand_count(id); ++k) {
      auto o = g.operand(id, k);
      if (o.is_node())
        stack.push_back(o.id);
      else if (o.is_input())
        out.insert(o.id);
    }
  }
  return out;
}

std::optional<double> literal_number(const value_ref& v) {
  if (!v.is_literal())
    return std::nullopt;
  auto j = json::parse(v.literal, nullptr, false);
  if (j.is_number())
    return j.get<double>();
  return std::nullopt;
}

// A scalar computed from literals alone (1 / sqrt(128.0) spelled as ops): folded.
std::optional<double> constant_value(const graph_view& g, const value_ref& v, int depth = 0) {
  if (v.is_literal())
    return literal_number(v);
  if (!v.is_node() || depth > 16 || !g.shape(v).empty())
    return std::nullopt;
  auto p = g.primitive(v.id);
  std::vector<double> x;
  for (unsigned k = 0; k < g.operand_count(v.id); ++k) {
    auto c = constant_value(g, g.operand(v.id, k), depth + 1);
    if (!c)
      return std::nullopt;
    x.push_back(*c);
  }
  if (x.size() == 1) {
    if (p == "convert_element_type" || p == "copy")
      return x[0];
    if (p == "sqrt")
      return std::sqrt(x[0]);
    if (p == "rsqrt")
      return 1.0 / std::sqrt(x[0]);
    if (p == "neg")
      return -x[0];
  }
  if (x.size() == 2) {
    if (p == "mul")
      return x[0] * x[1];
    if (p == "div")
      return x[0] / x[1];
    if (p == "add")
      return x[0] + x[1];
    if (p == "sub")
      return x[0] - x[1];
    if (p == "pow")
      return std::pow(x[0], x[1]);
  }
  return std::nullopt;
}

bool is_neg_inf(const graph_view& g, value_ref v) {
  v = skip_views(g, v);
  if (!v.is_literal())
    return false;
  auto j = json::parse(v.literal, nullptr, false);
  if (j.is_string())
    return j.get<std::string>() == "-inf";
  return j.is_number() && std::isinf(j.get<double>()) && j.get<double>() < 0;
}

std::vector<int> ints_of(const json& j) {
  std::vector<int> out;
  if (j.is_array())
    for (const auto& x : j)
      if (x.is_number_integer())
        out.push_back(x.get<int>());
  return out;
}

// A strided slice of the gathered pages along one axis: which axis, stride and start.
struct kv_slice {
  int node = -1;
  int axis = -1;
  int stride = 1;
  int start = 0;
};

std::optional<kv_slice> read_slice(const graph_view& g, int id) {
  if (g.primitive(id) != "slice")
    return std::nullopt;
  const auto& p = g.params(id);
  auto start = ints_of(p.value("start_indices", json()));
  auto limit = ints_of(p.value("limit_indices", json()));
  auto strides = ints_of(p.value("strides", json()));
  auto shape = g.shape(g.operand(id, 0));
  if (start.size() != shape.size() || limit.size() != shape.size())
    return std::nullopt;
  kv_slice s;
  s.node = id;
  for (size_t a = 0; a < shape.size(); ++a) {
    int st = a < strides.size() ? strides[a] : 1;
    bool whole = start[a] == 0 && limit[a] == shape[a] && st == 1;
    if (whole)
      continue;
    if (s.axis >= 0)
      return std::nullopt;  // sliced along two axes
    // every stride-th entry from `start` to the end
    if (st < 1 || start[a] >= st || limit[a] != shape[a] || shape[a] % st != 0)
      return std::nullopt;
    s.axis = static_cast<int>(a);
    s.stride = st;
    s.start = start[a];
  }
  return s.axis >= 0 ? std::optional<kv_slice>(s) : std::nullopt;
}

// The dot_general consuming (through views) the value of node `id`, and which operand.
std::vector<std::pair<int, int>> dots_reading(const graph_view& g, int id) {
  std::vector<std::pair<int, int>> out;
  std::vector<int> stack{id};
  std::set<int> seen;
  static const std::set<std::string> views = {"reshape", "broadcast_in_dim", "transpose",
                                              "squeeze", "expand_dims", "convert_element_type",
                                              "copy", "copy_p"};
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second)
      continue;
    for (int c : g.consumers(n)) {
      auto p = g.primitive(c);
      if (p == "dot_general") {
        for (unsigned k = 0; k < g.operand_count(c) && k < 2; ++k) {
          auto o = g.operand(c, k);
          if (o.is_node() && o.id == n)
            out.push_back({c, static_cast<int>(k)});
        }
      } else if (views.count(p)) {
        stack.push_back(c);
      }
    }
  }
  return out;
}

struct ragged_facts {
  int q = -1, pool = -1, table = -1, lens = -1, cu = -1, count = -1;
  int stride = 1, k_slot = 0, v_slot = 1;
  double scale = 1.0;
  std::string dot_dtype, pv_dtype, out_dtype;
};

bool match_ragged(const graph_view& g, ragged_facts& f, std::string& why) {
  if (g.output_count() != 1) {
    why = "not one output";
    return false;
  }
  auto out = g.output(0);
  auto out_shape = g.shape(out);
  f.out_dtype = g.dtype(out);
  if (out_shape.size() != 3 || !is_float(f.out_dtype)) {
    why = "the output is not [tokens, heads, head_dim]";
    return false;
  }
  for (int gn : g.find("gather")) {
    auto pool = g.operand(gn, 0);
    if (!pool.is_input())
      continue;
    auto pshape = g.shape(pool);
    if (pshape.size() != 4 || !is_float(g.dtype(pool)))
      continue;
    const auto& params = g.params(gn);
    const auto& dn = params.value("dimension_numbers", json::object());
    auto collapsed = ints_of(dn.value("collapsed_slice_dims", json()));
    auto start_map = ints_of(dn.value("start_index_map", json()));
    auto slice = ints_of(params.value("slice_sizes", json()));
    if (collapsed != std::vector<int>{0} || start_map != std::vector<int>{0} || slice.size() != 4 ||
        slice[0] != 1 || slice[1] != pshape[1] || slice[2] != pshape[2] || slice[3] != pshape[3])
      continue;
    // the page table: a rank-2 int input behind the indices
    int table = -1;
    for (int in : upstream_inputs(g, g.operand(gn, 1))) {
      auto t = g.input_type(static_cast<unsigned>(in));
      if (t.getShape().size() == 2 && is_int(t.getDtype().cStr()))
        table = in;
    }
    if (table < 0)
      continue;
    auto gshape = g.shape(node_value(gn));
    int comb_axis = static_cast<int>(gshape.size()) - 2;  // the pool's combined-head axis
    std::vector<kv_slice> slices;
    for (int c : g.consumers(gn))
      if (auto s = read_slice(g, c); s && s->axis == comb_axis)
        slices.push_back(*s);
    if (slices.size() != 2 || slices[0].stride != slices[1].stride ||
        slices[0].start == slices[1].start)
      continue;
    // K: the slice whose product's other operand is the query input; V: the other one
    int qk = -1, pv = -1, k_index = -1;
    for (int i = 0; i < 2; ++i)
      for (auto [d, side] : dots_reading(g, slices[i].node)) {
        auto other = skip_views(g, g.operand(d, 1 - side));
        // a literal factor of the queries: q * scale
        double qscale = 1.0;
        while (other.is_node() && g.primitive(other.id) == "mul") {
          auto a = g.operand(other.id, 0), b = g.operand(other.id, 1);
          if (auto x = constant_value(g, skip_views(g, b))) {
            qscale *= *x;
            other = skip_views(g, a);
          } else if (auto y = constant_value(g, skip_views(g, a))) {
            qscale *= *y;
            other = skip_views(g, b);
          } else {
            break;
          }
        }
        if (other.is_input() && g.shape(other) == out_shape && is_float(g.dtype(other))) {
          qk = d;
          k_index = i;
          f.q = other.id;
          f.scale = qscale;
          f.dot_dtype = g.dtype(g.operand(d, static_cast<unsigned>(side)));
        }
      }
    if (qk < 0)
      continue;
    int v_index = 1 - k_index;
    for (auto [d, side] : dots_reading(g, slices[v_index].node))
      if (depends_on(g, g.operand(d, 1 - side), qk)) {
        pv = d;
        f.pv_dtype = g.dtype(g.operand(d, static_cast<unsigned>(side)));
      }
    if (pv < 0) {
      why = "no probabilities-values product";
      continue;
    }
    // between the two products: scale factors, a select with -inf (the mask) and an exp
    bool masked = false, softmax = false;
    for (int n = qk + 1; n < pv; ++n) {
      auto p = g.primitive(n);
      bool feeds_pv = depends_on(g, g.operand(pv, 0), n) || depends_on(g, g.operand(pv, 1), n);
      if (!feeds_pv || !depends_on(g, node_value(n), qk))
        continue;
      if (p == "exp")
        softmax = true;
      if (p == "select_n")
        for (unsigned k = 1; k < g.operand_count(n); ++k)
          masked = masked || is_neg_inf(g, g.operand(n, k));
      if ((p == "mul" || p == "div") && g.operand_count(n) == 2) {
        auto a = g.operand(n, 0), b = g.operand(n, 1);
        bool a_scores = a.is_node() && depends_on(g, a, qk);
        auto lit = constant_value(g, skip_views(g, a_scores ? b : a));
        if (lit && (a_scores || p == "mul") && !softmax)
          f.scale = p == "mul" ? f.scale * *lit : f.scale / *lit;
      }
    }
    if (!softmax || !masked) {
      why = "no causally masked softmax between the products";
      continue;
    }
    // the per-sequence scalars: kv lengths [S], query bounds [S + 1], the sequence count
    int64_t seqs = g.input_type(static_cast<unsigned>(table)).getShape()[0];
    auto used = upstream_inputs(g, out);
    f.lens = f.cu = f.count = -1;
    for (int in : used) {
      auto t = g.input_type(static_cast<unsigned>(in));
      if (!is_int(t.getDtype().cStr()) || in == table)
        continue;
      auto s = to_vector(t.getShape());
      int64_t n = 1;
      for (auto x : s)
        n *= x;
      if (s.size() == 1 && n == seqs && f.lens < 0)
        f.lens = in;
      else if (s.size() == 1 && n == seqs + 1 && f.cu < 0)
        f.cu = in;
      else if (n == 1 && s.size() <= 1 && f.count < 0)
        f.count = in;
      else {
        why = "an int input of no ragged role";
        return false;
      }
    }
    if (f.lens < 0 || f.cu < 0 || f.count < 0) {
      why = "kv lengths, query bounds or the sequence count not found";
      continue;
    }
    int64_t combined = pshape[2], heads = out_shape[1], d = out_shape[2];
    int stride = slices[0].stride;
    if (pshape[3] != d || combined % stride != 0 || heads % (combined / stride) != 0) {
      why = "heads do not group over the kv heads";
      continue;
    }
    f.pool = pool.id;
    f.table = table;
    f.stride = stride;
    f.k_slot = slices[static_cast<size_t>(k_index)].start;
    f.v_slot = slices[static_cast<size_t>(v_index)].start;
    return true;
  }
  if (why.empty())
    why = "no page pool read through a page table";
  return false;
}

class ragged_paged_attention_template final : public kernel_template {
public:
  std::string name() const override { return "ragged_paged_attention"; }

  std::string covers() const override {
    return "causal attention of a ragged mixed batch (prefill chunks and decodes) over a paged "
           "KV cache: page table, kv lengths and query bounds in SMEM by scalar prefetch, pages "
           "copied by DMA, only the sequences of each token block visited";
  }

  std::optional<template_match> match(const graph_view& graph,
                                      schema::KernelSpec::Reader spec) const override {
    ragged_facts f;
    std::string why;
    if (!match_ragged(graph, f, why))
      return std::nullopt;
    auto sig = make_signature(spec);
    if (sig.graph_inputs.size() != graph.input_count())
      return std::nullopt;
    auto qshape = to_vector(graph.input_type(static_cast<unsigned>(f.q)).getShape());
    auto pshape = to_vector(graph.input_type(static_cast<unsigned>(f.pool)).getShape());
    auto tshape = to_vector(graph.input_type(static_cast<unsigned>(f.table)).getShape());
    int64_t d = qshape[2];
    // a scale of head_dim^-1/2 stays tied to the head dim at reduced test sizes
    std::string scale = fmt::format("{:.17g}", f.scale);
    if (std::abs(f.scale * std::sqrt(static_cast<double>(d)) - 1.0) < 1e-6)
      scale = fmt::format("{}.shape[-1] ** -0.5", sig.input(f.q));
    template_match m;
    m.family = name();
    int64_t kv_heads = pshape[2] / f.stride;
    m.summary = fmt::format(
        "ragged paged attention: {} tokens x {} heads x {} over {} kv heads (K/V at slots {}/{} "
        "of {}), {} sequences x {} pages of {} rows, scale {}",
        qshape[0], qshape[1], d, kv_heads, f.k_slot, f.v_slot, f.stride, tshape[0], tshape[1],
        pshape[1], scale);
    m.facts = {{"tokens", qshape[0]},       {"heads", qshape[1]},
               {"head_dim", d},             {"kv_heads", kv_heads},
               {"stride", f.stride},        {"page", pshape[1]},
               {"pages_per_seq", tshape[1]}, {"itemsize_q", f.dot_dtype == "float32" ? 4 : 2},
               {"itemsize_kv", std::string(graph.input_type(static_cast<unsigned>(f.pool)).getDtype().cStr()) == "float32" ? 4 : 2},
               {"pv_dtype", is_float(f.pv_dtype) && f.pv_dtype != "float32" ? "bfloat16" : "float32"},
               {"signature", signature_facts(sig)}};
    m.facts["generated"] = fmt::format(
        "def workload({}):\n"
        "    return _ragged_paged({}, {}, {}, {}, {}, {}, scale={}, stride={}, k_slot={}, "
        "v_slot={},\n                         dot_dtype=\"{}\", out_dtype=\"{}\")\n",
        sig.args(), sig.input(f.q), sig.input(f.pool), sig.input(f.lens), sig.input(f.table),
        sig.input(f.cu), sig.input(f.count), scale, f.stride, f.k_slot, f.v_slot,
        f.dot_dtype == "float32" ? "float32" : "bfloat16", f.out_dtype);
    m.score = 4.0;  // more specific than paged_attention and flash_attention
    return m;
  }

  json initial_params(const template_match& m, const config::chip& chip) const override {
    // 64 pages per step: a quarter of the grid steps of 16 (modeled v6e, grid schedule:
    // 7081 us vs 9539 us; the published tuned setting is 64 pages as well)
    json params = {{"block_q", 128},
                   {"pages_per_block", 64},
                   {"pv_dtype", m.facts.value("pv_dtype", std::string("float32"))},
                   {"schedule", "grid"},
                   {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes * 0.6);
    while (vmem_bytes(m, params) > budget && params["pages_per_block"].get<int64_t>() > 1)
      params["pages_per_block"] = params["pages_per_block"].get<int64_t>() / 2;
    return params;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    std::vector<tunable> t;
    tunable bq;
    bq.name = "block_q";
    bq.extent = m.facts.value("tokens", 1);
    bq.align = m.facts.value("itemsize_q", 2) == 4 ? 8 : 16;
    bq.grid_axis = 1;
    bq.meaning = "query tokens per block";
    t.push_back(bq);
    tunable pb;
    pb.name = "pages_per_block";
    pb.extent = m.facts.value("pages_per_seq", 1);
    pb.align = 1;
    pb.reduction = true;
    pb.meaning = "pages copied and attended per step";
    t.push_back(pb);
    tunable pv;
    pv.name = "pv_dtype";
    pv.what = tunable::kind::choice;
    pv.choices = {"bfloat16", "float32"};
    pv.meaning = "operand dtype of the P @ V matmul (f32 accumulation either way)";
    t.push_back(pv);
    tunable sch;
    sch.name = "schedule";
    sch.what = tunable::kind::choice;
    sch.choices = {"grid", "loop"};
    sch.meaning = "grid: (token block, sequence) work items and kv blocks as grid axes (static "
                  "work per step); loop: loops over them inside each token block";
    t.push_back(sch);
    tunable vl;
    vl.name = "vmem_limit_bytes";
    vl.what = tunable::kind::choice;
    for (int64_t mib : {16, 32, 48, 64, 96})
      vl.choices.push_back(mib * 1024 * 1024);
    vl.meaning = "scoped VMEM limit of the kernel";
    t.push_back(vl);
    return t;
  }

  int64_t vmem_bytes(const template_match& m, const json& params) const override {
    const auto& f = m.facts;
    int64_t d = f.value("head_dim", 128), group = f.value("heads", 1) / std::max<int64_t>(1, f.value("kv_heads", 1));
    int64_t bq = effective_block(f.value("tokens", 1), 8, params.value("block_q", 128));
    int64_t ppb = std::min<int64_t>(params.value("pages_per_block", 16), f.value("pages_per_seq", 1));
    int64_t bk = ppb * f.value("page", 16);
    int64_t qi = f.value("itemsize_q", 2), kvi = f.value("itemsize_kv", 2);
    int64_t buffers = 2 * bk * f.value("stride", 2) * d * kvi;  // two slots of pages
    int64_t blocks = 2 * 2 * bq * group * d * qi;                 // q and out, double-buffered
    int64_t scratch = group * bq * (2 * 128 + d) * 4;
    return buffers + blocks + scratch + 3 * bq * bk * 4;
  }

  bool render(const template_match& m, const json& params, std::string& source,
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
    int64_t bq, ppb, vmem;
    if (!get_int("block_q", 1, 1 << 16, bq) || !get_int("pages_per_block", 1, 4096, ppb) ||
        !get_int("vmem_limit_bytes", 1 << 20, int64_t(1) << 32, vmem))
      return false;
    std::string pv = params.value("pv_dtype", std::string());
    if (pv != "bfloat16" && pv != "float32") {
      error = "parameter pv_dtype must be \"bfloat16\" or \"float32\"";
      return false;
    }
    std::string schedule = params.value("schedule", std::string("grid"));
    if (schedule != "grid" && schedule != "loop") {
      error = "parameter schedule must be \"grid\" or \"loop\"";
      return false;
    }
    return fill_template("ragged_paged_attention.py",
                         {{"summary", m.summary},
                          {"params", params.dump()},
                          {"block_q", std::to_string(bq)},
                          {"pages_per_block", std::to_string(ppb)},
                          {"pv_dtype", pv},
                          {"schedule", schedule},
                          {"vmem_limit_bytes", std::to_string(vmem)},
                          {"generated", m.facts.value("generated", std::string())}},
                         source, error);
  }
};

}  // namespace

template_ptr make_ragged_paged_attention_template() {
  return std::make_shared<ragged_paged_attention_template>();
}

}  // namespace maxkernel::agents::expert
