// The flash_attention family: softmax attention forward (MHA, GQA, MQA, any layout, any
// score function generated from the reference, causal / local / global / length masks with
// fully masked key blocks skipped) as one online-softmax Pallas kernel.
// Refuses (no template applies) when an operand of the attention is computed in the
// reference (a projection before it: no prologue support), when the output feeds further
// computation (no epilogue support), when keys are split (paged caches: paged_attention),
// or when the score function uses an operation that has no tile form (reductions, gathers).
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

std::string py_tuple_ints(const std::vector<int>& v) {
  if (v.empty())
    return "()";
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

class flash_attention_template final : public kernel_template {
public:
  std::string name() const override { return "flash_attention"; }

  std::string covers() const override {
    return "softmax(f(Q K^T)) V attention forward: MHA/GQA/MQA, any layout, score modifiers "
           "(scale, soft-cap, bias), causal/local/global/length masks with block skipping";
  }

  std::optional<template_match> match(const graph_view& graph,
                                      schema::KernelSpec::Reader spec) const override {
    std::string why;
    auto p = find_attention(graph, why);
    if (!p || p->keys.size() != 1)
      return std::nullopt;
    attention_codegen cg(graph, *p, spec);
    if (!cg.build(why))
      return std::nullopt;
    template_match m;
    m.family = name();
    m.summary = cg.summary();
    m.facts = cg.facts();
    m.facts["generated"] = generate(cg);
    m.score = 2.0;  // a dedicated attention kernel beats generic matmul/row-wise matches
    return m;
  }

  nlohmann::json initial_params(const template_match& m,
                                const config::chip& chip) const override {
    nlohmann::json params = {{"block_q", 1024}, {"block_k", 1024},
                             {"pv_dtype", default_pv_dtype(m)}, {"qk_dtype", "auto"},
                             {"row_semantics", "parallel"},
                             {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
    if (m.facts.value("head_axis", -1) >= 0)
      params["block_h"] = 1;
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes * 0.6);
    while (vmem_bytes(m, params) > budget) {
      int64_t bq = params["block_q"], bk = params["block_k"];
      if (bq <= 16 && bk <= 128)
        break;
      if (bq >= bk && bq > 16)
        params["block_q"] = bq / 2;
      else
        params["block_k"] = bk / 2;
    }
    int64_t need = vmem_bytes(m, params);
    if (need > static_cast<int64_t>(chip.scoped_vmem_bytes * 0.8))
      params["vmem_limit_bytes"] =
          std::min<int64_t>(static_cast<int64_t>(chip.vmem_bytes * 0.9), 2 * need);
    return params;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    int nc = static_cast<int>(m.facts["kv_rows"].size());
    std::vector<tunable> t;
    tunable bq;
    bq.name = "block_q";
    bq.what = tunable::kind::block;
    bq.extent = m.facts["rows"];
    bq.align = m.facts["row_align"];
    bq.grid_axis = nc;
    bq.meaning = "query rows (positions x heads of a group) per block";
    t.push_back(bq);
    tunable bk;
    bk.name = "block_k";
    bk.what = tunable::kind::block;
    bk.extent = m.facts["keys"];
    bk.align = 128;
    bk.grid_axis = nc + 1;
    bk.reduction = true;
    bk.meaning = "keys per block (the online-softmax reduction axis)";
    t.push_back(bk);
    if (auto bh = heads_tunable(m.facts))
      t.push_back(*bh);
    tunable pv;
    pv.name = "pv_dtype";
    pv.what = tunable::kind::choice;
    pv.choices = {"bfloat16", "float32"};
    pv.meaning = "operand dtype of the P @ V matmul (f32 accumulation either way)";
    t.push_back(pv);
    tunable qk;
    qk.name = "qk_dtype";
    qk.what = tunable::kind::choice;
    qk.choices = {"auto", "bfloat16"};
    qk.meaning = "operand dtype of the Q K^T matmuls (auto: the reference's, exact bf16 "
                 "products where both sides are upcast bf16)";
    t.push_back(qk);
    tunable sem;
    sem.name = "row_semantics";
    sem.what = tunable::kind::choice;
    sem.choices = {"parallel", "arbitrary"};
    sem.meaning = "dimension semantics of the kv-row and row-block grid axes (megacore split)";
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
    int64_t rows = f.value("rows", 1), keys = f.value("keys", 1);
    int64_t bq = effective_block(rows, f.value("row_align", 8), params.value("block_q", 1024));
    int64_t bk = effective_block(keys, 128, params.value("block_k", 512));
    int64_t dv = f.value("value_dim", 128);
    int64_t bh = heads_per_block(f, params);
    int64_t qi = f.value("itemsize_q", 2), kvi = f.value("itemsize_kv", 2);
    int64_t oi = f.value("itemsize_out", 2), ti = f.value("tile_bytes", 0);
    int64_t blocks = 0;
    for (const auto& d : f["qk_dims"]) {
      int64_t dd = d.get<int64_t>();
      blocks += bq * dd * qi + bk * dd * kvi;
    }
    blocks += (f.value("v_shared", false) ? 0 : bk * dv * kvi) + bq * bk * ti + bq * dv * oi;
    int64_t scratch = 2 * bq * 128 * 4 + bq * std::max<int64_t>(dv, 128) * 4;
    int64_t temporaries = 3 * bq * bk * 4;
    return bh * (2 * blocks + scratch + temporaries);
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
    int64_t bq, bk, bh = 1, vmem;
    if (params.contains("block_h") && !get_int("block_h", 1, 1 << 16, bh))
      return false;
    if (!get_int("block_q", 1, 1 << 16, bq) || !get_int("block_k", 1, 1 << 17, bk) ||
        !get_int("vmem_limit_bytes", 1 << 20, int64_t(1) << 32, vmem))
      return false;
    std::string pv = params.value("pv_dtype", std::string());
    if (pv != "bfloat16" && pv != "float32") {
      error = "parameter pv_dtype must be \"bfloat16\" or \"float32\"";
      return false;
    }
    std::string qk = params.value("qk_dtype", std::string("auto"));
    if (qk != "auto" && qk != "bfloat16") {
      error = "parameter qk_dtype must be \"auto\" or \"bfloat16\"";
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
    return fill_template("flash_attention.py",
                         {{"summary", m.summary},
                          {"params", params.dump()},
                          {"block_q", std::to_string(bq)},
                          {"block_k", std::to_string(bk)},
                          {"block_h", std::to_string(bh)},
                          {"pv_dtype", pv},
                          {"qk_dtype", qk},
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

  static std::string generate(const attention_codegen& cg) {
    std::string body = cg.prologue_code();
    body += cg.sizes_code();
    body += cg.functions();
    std::string terms = "[";
    for (size_t t = 0; t < cg.q_views().size(); ++t) {
      const auto& q = cg.q_views()[t];
      const auto& k = cg.k_views()[t];
      body += q.code + k.code;
      terms += fmt::format("\n        ({}, {}, _pre_q{}, {}, {}, _pre_k{}, \"{}\", \"{}\"),", q.var,
                           q.axes, t, k.var, k.axes, t, cg.term_dtypes()[t].first,
                           cg.term_dtypes()[t].second);
    }
    terms += "]";
    if (cg.v_shared_with() < 0)
      body += cg.v_view().code;
    std::string tiles = "[";
    for (const auto& tv : cg.tile_views()) {
      body += tv.code;
      tiles += fmt::format("({}, {}), ", tv.var, tv.axes);
    }
    tiles += "]";
    std::string scalars = "[";
    for (size_t i = 0; i < cg.scalar_views().size(); ++i) {
      body += cg.scalar_views()[i].code;
      scalars += fmt::format("({}, {}), ", cg.scalar_views()[i].var,
                             py_tuple_ints(cg.scalar_c()[i]));
    }
    scalars += "]";
    body += fmt::format(
        "o = _flash(\n    {},\n    ({}, {}, _pre_v, {}),\n    {},\n    {},\n"
        "    c_sizes={}, rows={}, keys={},\n    out_shape={}, out_axes={}, out_dtype=\"{}\",\n"
        "    score=_score, score_live={}, kill={}, kill_static={}, kill_c={}, kill_rows={},\n"
        "    row_align={}, head_axis={})\n",
        terms, cg.v_shared_with() < 0 ? cg.v_view().var : "None",
        cg.v_shared_with() < 0 ? cg.v_view().axes : "None", cg.v_shared_with(), tiles, scalars, cg.c_sizes(), cg.rows_size(),
        cg.keys_size(), cg.out_view().shape, cg.out_view().axes,
        cg.facts()["out_dtype"].get<std::string>(),
        cg.has_live_score() ? "_score_live" : "None", cg.has_kill() ? "_kill" : "None",
        cg.kill_static() ? "True" : "False", py_tuple_ints(cg.kill_c()),
        cg.kill_rows() ? "True" : "False", cg.row_align(), cg.head_axis());
    body += cg.out_view().code;
    body += cg.epilogue_code();
    body += "return " + cg.result() + "\n";
    std::string code = cg.module_code();
    code += "def workload(" + cg.signature() + "):\n    " + indent(body, 4) + "\n";
    return code;
  }
};

}  // namespace

template_ptr make_flash_attention_template() {
  return std::make_shared<flash_attention_template>();
}

}  // namespace maxkernel::agents::expert
