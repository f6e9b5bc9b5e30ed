// Template "rowwise": references that are, as a whole, an elementwise and last-axis reduction
// chain over inputs sharing a row layout [rows..., D] (rmsnorm, layernorm with weight and
// bias, softmax, log-softmax, cross-entropy over a vocabulary with labels, any elementwise
// chain), generated from the jaxpr by block_program. Blocks are (block_rows, D) when the
// chain reduces rows and some output spans them; (block_rows, block_d) with row statistics
// carried across D blocks when every output is a row statistic; (block_rows, block_d) tiles
// when nothing is reduced. A chain reducing one other axis (softmax over axis 0, over the
// classes of [B, C, S]) runs in column mode (see match_columns). Refused: matmuls,
// convolutions, loops, reductions over several axes or over part of D (grouped), gathers
// other than one element per row.
#include "agents/expert/block_program.hpp"
#include "agents/expert/block_size.hpp"
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

int64_t round_up(int64_t x, int64_t m) { return m <= 0 ? x : (x + m - 1) / m * m; }

int64_t sublane_align(const std::string& dtype) {
  int b = dtype_bytes(dtype);
  return b >= 4 ? 8 : 8 * (4 / b);
}

int64_t tile_bytes(int64_t rows, int64_t cols, const std::string& dtype) {
  return round_up(rows, sublane_align(dtype)) * round_up(cols, 128) * dtype_bytes(dtype);
}

int64_t elements(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s)
    n *= d;
  return n;
}

// Seeds the request with every graph input of the main input's full shape (blocked as the
// space maps it) and asks for every graph output; the indices of the seeded inputs, or none
// when an input's dims do not map onto the space.
std::optional<std::vector<int>> seed_full_inputs(const graph_view& g,
                                                 const std::vector<int64_t>& shape,
                                                 block_request& req) {
  std::vector<int> seeded;
  for (unsigned k = 0; k < g.input_count(); ++k) {
    value_ref v{value_ref::kind::input, static_cast<int>(k), ""};
    if (g.shape(v) != shape)
      continue;
    block_seed sd;
    sd.value = v;
    if (!map_dims_to_factors(shape, req.space, sd.dims))
      return std::nullopt;
    req.seeds.push_back(sd);
    seeded.push_back(static_cast<int>(k));
  }
  for (unsigned k = 0; k < g.output_count(); ++k)
    req.outputs.push_back(g.output(k));
  return seeded;
}

class rowwise_template final : public kernel_template {
public:
  std::string name() const override { return "rowwise"; }
  std::string covers() const override {
    return "row-wise fused kernels generated from the reference: elementwise chains and "
           "last-axis reductions (norms, softmax, log-softmax, cross-entropy with labels)";
  }

  // Column mode: the chain reduces one axis `a` that is not the last (softmax over axis 0 of
  // [D, R], log-softmax over the classes of [B, C, S], a channel norm of NCHW). The space is
  // (P, R, D) = (dims before a, a, dims after a): a plain reshape, no transpose. A block holds
  // all of R for bd columns of D (lanes) and one P entry; the reduction runs down the
  // sublanes, which is cheap on the VPU. All of R must fit VMEM at bd = 128 (not split).
  std::optional<template_match> match_columns(const graph_view& g, const workload_signature& sig,
                                              int main_input) const {
    value_ref mainv{value_ref::kind::input, main_input, ""};
    auto shape = g.shape(mainv);
    const int rank = static_cast<int>(shape.size());
    std::set<int> axes;
    for (unsigned i = 0; i < g.size(); ++i) {
      auto p = g.primitive(static_cast<int>(i));
      if (p != "reduce_sum" && p != "reduce_max" && p != "reduce_min" && p != "argmax" &&
          p != "argmin")
        continue;
      if (g.shape(g.operand(static_cast<int>(i), 0)) != shape)
        return std::nullopt;  // reductions of other shapes: not one column chain
      for (auto& x : g.params(static_cast<int>(i)).value("axes", json::array()))
        axes.insert(x.get<int>() < 0 ? x.get<int>() + rank : x.get<int>());
    }
    if (rank < 2 || axes.size() != 1 || *axes.begin() == rank - 1)
      return std::nullopt;
    const int a = *axes.begin();
    const std::string& mname = sig.input(main_input);
    std::vector<space_axis> space(3);
    space[0].squeezed = true;
    for (int d = 0; d < rank; ++d) {
      auto& ax = space[static_cast<size_t>(d < a ? 0 : d == a ? 1 : 2)];
      ax.factors.push_back(shape[static_cast<size_t>(d)]);
      ax.factor_exprs.push_back(fmt::format("{}.shape[{}]", mname, d));
    }
    block_request req;
    req.space = space;
    req.name = "rows";
    auto seeded = seed_full_inputs(g, shape, req);
    if (!seeded)
      return std::nullopt;
    std::vector<int> seed_inputs = std::move(*seeded);
    block_program prog;
    std::string why;
    if (!build_block_program(g, req, prog, why) || prog.reduced[0] || !prog.reduced[1] ||
        prog.reduced[2])
      return std::nullopt;
    json seed_dtypes = json::array(), extras = json::array(), extra_dtypes = json::array();
    std::string prep = fmt::format("    P, R, D = {}, {}, {}\n    seeds = [\n",
                                   space[0].extent_expr(), space[1].extent_expr(),
                                   space[2].extent_expr());
    for (int k : seed_inputs) {
      value_ref v{value_ref::kind::input, k, ""};
      std::string dt = g.dtype(v) == "bool" ? "int32" : g.dtype(v);
      seed_dtypes.push_back(dt);
      prep += fmt::format("        jnp.reshape({}, (P, R, D)){},\n", sig.input(k),
                          dt != g.dtype(v) ? ".astype(jnp.int32)" : "");
    }
    prep += "    ]\n    extras = [\n";
    for (auto& op : prog.operands) {
      const std::string& nm = sig.input(op.input);
      if (op.scalar) {
        extras.push_back(nullptr);
        extra_dtypes.push_back(nullptr);
        prep += fmt::format("        jnp.reshape(jnp.asarray({}), (1,)).astype(jnp.{}),\n", nm,
                            is_float_dtype(op.dtype) ? "float32" : "int32");
        continue;
      }
      std::string dt = op.dtype == "bool" ? "int32" : op.dtype;
      extras.push_back({op.present[0], op.present[1], op.present[2]});
      extra_dtypes.push_back(dt);
      prep += fmt::format("        jnp.reshape({}, {}){},\n", nm, op.space_shape,
                          op.dtype == "bool" ? ".astype(jnp.int32)" : "");
    }
    prep += "    ]";
    json outputs = json::array();
    std::string result;
    for (size_t k = 0; k < prog.outputs.size(); ++k) {
      auto& o = prog.outputs[k];
      outputs.push_back({{o.present[0], o.present[1], o.present[2]}, o.dtype});
      result += (k ? ", " : "") + fmt::format("outs[{}].reshape({})", k, o.ref_shape);
    }
    result = prog.outputs.size() == 1 ? "    return " + result : "    return (" + result + ")";
    std::string prims;
    for (auto& p : prog.primitives)
      prims += (prims.empty() ? "" : " ") + p;
    template_match tm;
    tm.family = name();
    tm.summary = fmt::format("columns: P={} R={} (axis {} reduced) D={} over {} input(s), {} "
                             "extra operand(s): [{}] in col mode",
                             space[0].extent(), space[1].extent(), a, space[2].extent(),
                             seed_inputs.size(), prog.operands.size(), prims);
    json config = {{"mode", "col"},
                   {"align", {8, 128}},
                   {"extras", extras},
                   {"outputs", outputs},
                   {"stream_accs", json::array()},
                   {"transcendentals", prog.transcendentals},
                   {"flops_per_element", static_cast<int>(prog.primitives.size())}};
    tm.facts = {{"signature", signature_facts(sig)},
                {"config", config},
                {"program", prog.code},
                {"prep", prep},
                {"result", result},
                {"sizes", {{"P", space[0].extent()}, {"R", space[1].extent()},
                           {"D", space[2].extent()}}},
                {"seed_dtypes", seed_dtypes},
                {"extra_dtypes", extra_dtypes}};
    tm.score = 1.0;
    return tm;
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    static const std::set<std::string> refused = {
        "dot_general", "conv_general_dilated", "ragged_dot", "ragged_dot_general", "scan",
        "while", "cond", "pallas_call", "sort", "cumsum", "scatter", "scatter-add"};
    for (unsigned i = 0; i < g.size(); ++i)
      if (refused.count(g.primitive(static_cast<int>(i))))
        return std::nullopt;
    auto sig = make_signature(spec);
    if (sig.graph_inputs.size() != g.input_count() || g.output_count() == 0)
      return std::nullopt;
    // The row layout: the biggest float input (else the biggest input).
    int main_input = -1;
    int64_t best = 0;
    bool best_float = false;
    for (unsigned k = 0; k < g.input_count(); ++k) {
      value_ref v{value_ref::kind::input, static_cast<int>(k), ""};
      auto s = g.shape(v);
      if (s.empty())
        continue;
      bool fl = is_float_dtype(g.dtype(v));
      int64_t n = elements(s);
      if ((fl && !best_float) || (fl == best_float && n > best)) {
        main_input = static_cast<int>(k);
        best = n;
        best_float = fl;
      }
    }
    if (main_input < 0)
      return std::nullopt;
    value_ref mainv{value_ref::kind::input, main_input, ""};
    auto shape = g.shape(mainv);
    const std::string& mname = sig.input(main_input);
    std::vector<space_axis> space(2);
    for (size_t d = 0; d + 1 < shape.size(); ++d) {
      space[0].factors.push_back(shape[d]);
      space[0].factor_exprs.push_back(fmt::format("{}.shape[{}]", mname, d));
    }
    space[1].factors.push_back(shape.back());
    space[1].factor_exprs.push_back(fmt::format("{}.shape[{}]", mname, shape.size() - 1));

    block_request req;
    req.space = space;
    req.name = "rows";
    req.stream_axis = 1;
    auto seeded = seed_full_inputs(g, shape, req);
    if (!seeded)
      return std::nullopt;
    std::vector<int> seed_inputs = std::move(*seeded);
    block_program prog;
    std::string why;
    // `why` says what the generator could not express; a reduction over rows is not a
    // row-wise kernel, unless it runs over one axis alone (column mode below)
    if (!build_block_program(g, req, prog, why) || prog.reduced[0]) {
      if (auto col = match_columns(g, sig, main_input))
        return col;
      return std::nullopt;
    }

    int64_t ar = 8;
    auto need = [](int64_t& a, int64_t v) { a = std::max(a, v); };
    json seed_dtypes = json::array();
    std::string prep = fmt::format("    R, D = {}, {}\n    seeds = [\n",
                                   space[0].factor_exprs.empty() ? "1" : space[0].extent_expr(),
                                   space[1].extent_expr());
    for (int k : seed_inputs) {
      value_ref v{value_ref::kind::input, k, ""};
      std::string dt = g.dtype(v) == "bool" ? "int32" : g.dtype(v);
      need(ar, sublane_align(dt));
      seed_dtypes.push_back(dt);
      prep += fmt::format("        jnp.reshape({}, (R, D)){},\n", sig.input(k),
                          dt != g.dtype(v) ? ".astype(jnp.int32)" : "");
    }
    prep += "    ]\n    extras = [\n";
    json extras = json::array(), extra_dtypes = json::array();
    for (auto& op : prog.operands) {
      const std::string& nm = sig.input(op.input);
      if (op.scalar) {
        extras.push_back(nullptr);
        extra_dtypes.push_back(nullptr);
        prep += fmt::format("        jnp.reshape(jnp.asarray({}), (1,)).astype(jnp.{}),\n", nm,
                            is_float_dtype(op.dtype) ? "float32" : "int32");
        continue;
      }
      // bool blocks travel as int32 (Mosaic has no i1 memrefs)
      std::string dt = op.dtype == "bool" ? "int32" : op.dtype;
      extras.push_back({op.present[0], op.present[1]});
      extra_dtypes.push_back(dt);
      if (op.present[0])
        need(ar, sublane_align(dt));
      prep += fmt::format("        jnp.reshape({}, {}){},\n", nm, op.space_shape,
                          op.dtype == "bool" ? ".astype(jnp.int32)" : "");
    }
    prep += "    ]";
    json outputs = json::array();
    std::string result;
    for (size_t k = 0; k < prog.outputs.size(); ++k) {
      auto& o = prog.outputs[k];
      outputs.push_back({{o.present[0], o.present[1]}, o.dtype});
      if (o.present[0])
        need(ar, sublane_align(o.dtype));
      result += (k ? ", " : "") + fmt::format("outs[{}].reshape({})", k, o.ref_shape);
    }
    result = prog.outputs.size() == 1 ? "    return " + result : "    return (" + result + ")";
    std::string mode = prog.reduced[1] ? (prog.streamable ? "stream" : "row") : "tile";
    json stream_accs = json::array();
    if (mode == "stream")
      for (auto& d : prog.accumulator_dtypes)
        stream_accs.push_back(d);

    std::string prims;
    for (auto& p : prog.primitives)
      prims += (prims.empty() ? "" : " ") + p;
    template_match tm;
    tm.family = name();
    tm.summary = fmt::format("rows={} D={} over {} row input(s), {} extra operand(s): [{}] in {} "
                             "mode",
                             space[0].extent(), space[1].extent(), seed_inputs.size(),
                             prog.operands.size(), prims, mode);
    json config = {{"mode", mode},
                   {"align", {ar, 128}},
                   {"extras", extras},
                   {"outputs", outputs},
                   {"stream_accs", stream_accs},
                   {"transcendentals", prog.transcendentals},
                   {"flops_per_element", static_cast<int>(prog.primitives.size())}};
    std::string code = prog.code;
    if (mode == "stream")
      code += "\n\n" + prog.stream_code;
    tm.facts = {{"signature", signature_facts(sig)},
                {"config", config},
                {"program", code},
                {"prep", prep},
                {"result", result},
                {"sizes", {{"R", space[0].extent()}, {"D", space[1].extent()}}},
                {"seed_dtypes", seed_dtypes},
                {"extra_dtypes", extra_dtypes}};
    tm.score = 1.0;
    return tm;
  }

  struct blocks {
    int64_t br, bd;
  };
  blocks effective(const template_match& m, const json& params) const {
    const auto& c = m.facts["config"];
    int64_t R = m.facts["sizes"]["R"], D = m.facts["sizes"]["D"];
    auto get = [&](const char* k, int64_t d) {
      return params.contains(k) && params[k].is_number() ? params[k].get<int64_t>() : d;
    };
    if (c["mode"] == "col")  // all of R (the reduced axis) per block
      return {R, effective_block(D, 128, get("block_d", 2048))};
    return {effective_block(R, c["align"][0], get("block_rows", 256)),
            c["mode"] == "row" ? D : effective_block(D, 128, get("block_d", 2048))};
  }

  int64_t vmem_bytes(const template_match& m, const json& params) const override {
    const auto& c = m.facts["config"];
    auto b = effective(m, params);
    int64_t io = 0;
    for (const auto& dt : m.facts["seed_dtypes"])
      io += tile_bytes(b.br, b.bd, dt);
    for (size_t i = 0; i < c["extras"].size(); ++i) {
      const auto& pres = c["extras"][i];
      if (pres.is_null())
        continue;
      size_t r = pres.size() - 2;  // (rows, D) or, in col mode, (P, R, D): the last two
      io += tile_bytes(pres[r].get<bool>() ? b.br : 1, pres[r + 1].get<bool>() ? b.bd : 1,
                       m.facts["extra_dtypes"][i]);
    }
    for (const auto& o : c["outputs"]) {
      size_t r = o[0].size() - 2;
      io += tile_bytes(o[0][r].get<bool>() ? b.br : 1, o[0][r + 1].get<bool>() ? b.bd : 1, o[1]);
    }
    int64_t stats = static_cast<int64_t>(c["stream_accs"].size()) * tile_bytes(b.br, 1, "float32");
    // f32 copies of the block and the chain's temporaries.
    int64_t temps = 2 * tile_bytes(b.br, b.bd, "float32");
    return 2 * io + stats + temps;
  }

  json initial_params(const template_match& m, const config::chip& chip) const override {
    const auto& c = m.facts["config"];
    std::string mode = c["mode"];
    json p = {{"block_rows", 512},
              {"dimension_semantics", "parallel"},
              {"vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes)}};
    if (mode != "row")
      p["block_d"] = 2048;
    if (mode == "col")
      p.erase("block_rows");
    auto budget = static_cast<int64_t>(chip.scoped_vmem_bytes) * 3 / 4;
    int64_t ar = c["align"][0];
    for (int guard = 0; guard < 64 && vmem_bytes(m, p) > budget; ++guard) {
      auto b = effective(m, p);
      if (mode == "col" && b.bd > 128)
        p["block_d"] = b.bd / 2;
      else if (mode == "col")
        break;
      else if (b.br > std::max<int64_t>(ar, 64))
        p["block_rows"] = std::max(ar, b.br / 2);
      else if (mode != "row" && b.bd > 512)
        p["block_d"] = b.bd / 2;
      else if (b.br > ar)
        p["block_rows"] = std::max(ar, b.br / 2);
      else
        break;
      auto nb = effective(m, p);
      if (nb.br == b.br && nb.bd == b.bd)
        break;
    }
    auto need = vmem_bytes(m, p);
    if (need > budget)
      p["vmem_limit_bytes"] = std::min<int64_t>(static_cast<int64_t>(chip.vmem_bytes) * 7 / 8,
                                                round_up(need * 4 / 3, 1 << 20));
    return p;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    const auto& c = m.facts["config"];
    std::string mode = c["mode"];
    std::vector<tunable> ts;
    if (mode != "col")
      ts.push_back({"block_rows", tunable::kind::block, m.facts["sizes"]["R"], c["align"][0], 0,
                    0, false, {}, "rows per block"});
    if (mode != "row")
      ts.push_back({"block_d", tunable::kind::block, m.facts["sizes"]["D"], 128, 1, 0,
                    mode == "stream", {},
                    mode == "stream" ? "row elements per block (statistics carried across)"
                    : mode == "col"  ? "columns (lanes) per block, each with all of the reduced axis"
                                     : "row elements per block"});
    ts.push_back({"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
                  {"parallel", "arbitrary"},
                  "row blocks split across megacore TensorCores (parallel) or run in order"});
    ts.push_back({"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {},
                  "scoped VMEM limit"});
    return ts;
  }

  bool render(const template_match& m, const json& params, std::string& source,
              std::string& error) const override {
    const auto& c = m.facts["config"];
    std::vector<const char*> keys;
    if (c["mode"] != "col")
      keys.push_back("block_rows");
    if (c["mode"] != "row")
      keys.push_back("block_d");
    for (const char* k : keys)
      if (!params.contains(k) || !params[k].is_number_integer() || params[k].get<int64_t>() < 1) {
        error = std::string("param ") + k + " must be a positive integer";
        return false;
      }
    if (params.contains("dimension_semantics") && params["dimension_semantics"] != "parallel" &&
        params["dimension_semantics"] != "arbitrary") {
      error = "param dimension_semantics must be parallel or arbitrary";
      return false;
    }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number() ||
        params["vmem_limit_bytes"].get<double>() <= 0) {
      error = "param vmem_limit_bytes must be a positive number";
      return false;
    }
    const auto& f = m.facts;
    return fill_template("rowwise.py",
                         {{"header", header_comment(name(), m.summary, params.dump())},
                          {"params", python_literal(params)},
                          {"config", python_literal(f["config"])},
                          {"program", f["program"].get<std::string>()},
                          {"args", f["signature"]["args"].get<std::string>()},
                          {"prep", f["prep"].get<std::string>()},
                          {"result", f["result"].get<std::string>()}},
                         source, error);
  }
};

}  // namespace

template_ptr make_rowwise_template() { return std::make_shared<rowwise_template>(); }

}  // namespace maxkernel::agents::expert
