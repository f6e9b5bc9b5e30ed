// Template topk: a reference that takes lax.top_k over the last axis of a 2-D input (top-k
// sampling over a vocabulary, top-k routing scores) and then only works on the k results and
// on other small inputs. The selection is a Pallas kernel (whole rows in VMEM, k rounds of
// row max + lowest matching column + mask: the input is read once, nothing is sorted); what
// follows (softmax of the k values, cumulative sums, a draw against a uniform, gathers of
// the indices) is replayed from the graph as jnp on [rows, k] arrays.
// Refused: a top_k over another axis or of a computed input (other than casts and a
// positive scale), the big input read by anything else than the top_k (a full-vocabulary
// normaliser would need its own kernel), integer inputs (values and indices would share a
// dtype), primitives the replay does not know, loops.
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

value_ref input_ref(int k) { return value_ref{value_ref::kind::input, k, ""}; }

class topk_template final : public kernel_template {
public:
  std::string name() const override { return "topk"; }
  std::string covers() const override {
    return "top-k selection over the last axis of a [rows, V] input (Pallas, one read of the "
           "input) followed by any small post-processing of the k values and indices";
  }

  std::optional<template_match> match(const graph_view& g,
                                      schema::KernelSpec::Reader spec) const override {
    auto tops = g.find("top_k");
    if (tops.size() != 1 || g.in_loop(tops[0]))
      return std::nullopt;
    int top = tops[0];
    for (unsigned i = 0; i < g.size(); ++i)
      if (g.in_loop(static_cast<int>(i)))
        return std::nullopt;
    auto t = trace_operand(g, g.operand(top, 0));
    if (!t.source.is_input() || t.through_transpose || !(t.scale > 0))
      return std::nullopt;
    int x = t.source.id;
    auto xs = g.shape(input_ref(x));
    int k = g.params(top).value("k", 0);
    int axis = g.params(top).value("axis", static_cast<int>(xs.size()) - 1);
    if (xs.size() != 2 || axis != 1 || k < 1 || k > xs[1] || !is_float_dtype(g.dtype(input_ref(x))))
      return std::nullopt;
    // The nodes between x and the top_k (casts, the scale) and everything that reads x must
    // be that chain: the rest only sees the top_k's results.
    std::set<int> chain;
    for (value_ref v = g.operand(top, 0); v.is_node(); v = g.operand(v.id, 0)) {
      chain.insert(v.id);
      if (g.operand_count(v.id) == 0)
        break;
    }
    std::vector<uint64_t> reads_x(g.size(), 0);
    for (unsigned i = 0; i < g.size(); ++i) {
      int id = static_cast<int>(i);
      bool r = false;
      for (unsigned j = 0; j < g.operand_count(id); ++j) {
        auto o = g.operand(id, j);
        r = r || (o.is_input() && o.id == x) ||
            (o.is_node() && o.id != top && reads_x[static_cast<size_t>(o.id)]);
      }
      reads_x[i] = r;
      if (r && id != top && !chain.count(id))
        return std::nullopt;
    }
    // The outputs: top_k results directly, or values replayed from them.
    auto sig = make_signature(spec);
    std::string xname = sig.input(x);
    graph_facts::replay_sources sources;
    for (unsigned i = 0; i < g.input_count(); ++i)
      if (static_cast<int>(i) != x)
        sources.inputs[static_cast<int>(i)] = sig.input(static_cast<int>(i));
    sources.results[{top, 0}] = "top_values";
    sources.results[{top, 1}] = "top_indices";
    std::map<int64_t, std::string> sizes = {{xs[0], xname + ".shape[0]"}};
    std::vector<int> wanted;
    std::vector<std::string> returns;
    auto out_results = g.raw().getOutputResults();
    for (unsigned o = 0; o < g.output_count(); ++o) {
      auto v = g.output(o);
      if (v.is_input()) {
        returns.push_back(sig.input(v.id));
        continue;
      }
      if (!v.is_node())
        return std::nullopt;
      if (v.id == top) {
        int r = o < out_results.size() ? out_results[o] : 0;
        returns.push_back(r == 0 ? "top_values" : "top_indices");
        continue;
      }
      wanted.push_back(v.id);
      returns.push_back("t" + std::to_string(v.id));
    }
    std::string code, why;
    if (!wanted.empty() && !graph_facts::replay_values(g, wanted, sizes, sources, code, why))
      return std::nullopt;
    std::string ret;
    for (size_t i = 0; i < returns.size(); ++i)
      ret += (i ? ", " : "") + returns[i];
    template_match m;
    m.family = name();
    m.summary = fmt::format("top-{} over {} rows of {} (in{}), {} output(s), {} replayed op(s) after it",
                            k, xs[0], xs[1], x, g.output_count(),
                            std::count(code.begin(), code.end(), '\n'));
    m.facts = {{"x", x}, {"k", k}, {"rows", xs[0]}, {"width", xs[1]}, {"scale", t.scale},
               {"x_dtype", g.dtype(input_ref(x))},
               {"value_dtype", g.node(top).getResults()[0].getDtype().cStr()},
               {"epilogue", code}, {"returns", ret},
               {"signature", signature_facts(sig)}};
    m.score = 1.0;
    return m;
  }

  nlohmann::json initial_params(const template_match& m,
                                const config::chip& chip) const override {
    nlohmann::json p = {{"block_rows", effective_block(m.facts["rows"], 8, 8)},
                        {"unroll", 1},
                        {"dimension_semantics", "parallel"},
                        {"vmem_limit_bytes", chip.scoped_vmem_bytes}};
    // whole rows must fit: raise the limit when the scoped default is too small
    auto need = vmem_bytes(m, p);
    if (need > static_cast<int64_t>(chip.scoped_vmem_bytes))
      p["vmem_limit_bytes"] = std::min<int64_t>(static_cast<int64_t>(chip.vmem_bytes) * 9 / 10,
                                                need + need / 4);
    return p;
  }

  std::vector<tunable> tunables(const template_match& m) const override {
    return {
        {"block_rows", tunable::kind::block, m.facts["rows"], 8, 0, 0, false, {},
         "rows per block (each held whole in VMEM)"},
        {"unroll", tunable::kind::choice, 0, 1, -1, 0, false, {1, 2, 5},
         "unrolling of the k selection rounds"},
        {"dimension_semantics", tunable::kind::choice, 0, 1, -1, 0, false,
         {"parallel", "arbitrary"}, "row blocks split across TensorCores"},
        {"vmem_limit_bytes", tunable::kind::choice, 0, 1, -1, 0, false, {}, "scoped VMEM limit"},
    };
  }

  int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const override {
    int64_t rows = m.facts["rows"], width = m.facts["width"];
    int64_t br = effective_block(rows, 8, params.value("block_rows", int64_t{8}));
    int64_t lanes_w = (width + 127) / 128 * 128;
    int64_t in = 2 * br * lanes_w * dtype_bytes(m.facts["x_dtype"]);
    int64_t work = 2 * br * lanes_w * 4;  // the masked copy, and one temporary of its size
    int64_t outs = 2 * 2 * br * 128 * 4;
    return in + work + outs;
  }

  bool render(const template_match& m, const nlohmann::json& params, std::string& source,
              std::string& error) const override {
    if (!params.contains("block_rows") || !params["block_rows"].is_number_integer() ||
        params["block_rows"].get<int64_t>() < 1) {
      error = "param block_rows must be a positive integer";
      return false;
    }
    if (!params.contains("unroll") || !params["unroll"].is_number_integer() ||
        params["unroll"].get<int64_t>() < 1) {
      error = "param unroll must be a positive integer";
      return false;
    }
    auto sem = params.value("dimension_semantics", std::string());
    if (sem != "parallel" && sem != "arbitrary") {
      error = "param dimension_semantics must be parallel or arbitrary";
      return false;
    }
    if (!params.contains("vmem_limit_bytes") || !params["vmem_limit_bytes"].is_number()) {
      error = "param vmem_limit_bytes must be a number";
      return false;
    }
    const auto& sig = m.facts["signature"];
    int x = m.facts["x"];
    std::string xname =
        sig["names"][sig["graph_inputs"][static_cast<size_t>(x)].get<size_t>()].get<std::string>();
    std::string epilogue = m.facts["epilogue"].get<std::string>();
    return fill_template("topk.py",
                         {{"header", header_comment(name(), m.summary, params.dump())},
                          {"params", python_literal(params)},
                          {"k", std::to_string(m.facts["k"].get<int>())},
                          {"scale", fmt::format("{:.17g}", m.facts["scale"].get<double>())},
                          {"value_dtype", m.facts["value_dtype"].get<std::string>()},
                          {"args", sig["args"].get<std::string>()},
                          {"x", xname},
                          {"epilogue", epilogue.empty() ? "    pass" : "    " + indent(epilogue, 4)},
                          {"returns", m.facts["returns"].get<std::string>()}},
                         source, error);
  }
};

}  // namespace

template_ptr make_topk_template() { return std::make_shared<topk_template>(); }

}  // namespace maxkernel::agents::expert
