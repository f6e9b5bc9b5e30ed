#include "tests/agents/expert/scale_template.hpp"

#include "agents/expert/block_size.hpp"

#include <fmt/format.h>

namespace maxkernel::tests {

namespace ex = agents::expert;

std::optional<ex::template_match> scale_template::match(const ex::graph_view& g,
                                                        schema::KernelSpec::Reader) const {
  if (g.size() != 1 || g.primitive(0) != "mul" || g.output_count() != 1)
    return std::nullopt;
  auto x = g.operand(0, 0), c = g.operand(0, 1);
  if (!x.is_input() || !c.is_literal() || g.shape(x).size() != 2)
    return std::nullopt;
  auto shape = g.shape(x);
  ex::template_match m;
  m.family = name();
  m.summary = fmt::format("x[{}x{}] * {}", shape[0], shape[1], c.literal);
  m.facts = {{"rows", shape[0]}, {"cols", shape[1]}, {"c", c.literal}};
  return m;
}

nlohmann::json scale_template::initial_params(const ex::template_match&,
                                              const config::chip&) const {
  return {{"block_rows", 256}, {"block_cols", 512}, {"grid_order", "rows"}};
}

std::vector<ex::tunable> scale_template::tunables(const ex::template_match& m) const {
  ex::tunable r, c, o, v;
  r.name = "block_rows";
  r.extent = m.facts["rows"];
  r.align = 8;
  r.grid_axis = 0;
  r.meaning = "rows per block";
  c.name = "block_cols";
  c.extent = m.facts["cols"];
  c.align = 128;
  c.grid_axis = 1;
  o.name = "grid_order";
  o.what = ex::tunable::kind::choice;
  o.choices = {"rows", "cols"};
  v.name = "vmem_limit_bytes";
  v.what = ex::tunable::kind::choice;
  return {r, c, o, v};
}

int64_t scale_template::vmem_bytes(const ex::template_match& m,
                                   const nlohmann::json& params) const {
  int64_t br = ex::effective_block(m.facts["rows"], 8, params.value("block_rows", 256));
  int64_t bc = ex::effective_block(m.facts["cols"], 128, params.value("block_cols", 512));
  return 2 * 2 * br * bc * 4;  // in and out, double-buffered, f32
}

bool scale_template::render(const ex::template_match& m, const nlohmann::json& params,
                            std::string& source, std::string& error) const {
  if (!params.contains("block_rows") || !params["block_rows"].is_number()) {
    error = "block_rows missing";
    return false;
  }
  bool cols_first = params.value("grid_order", "rows") == "cols";
  source = fmt::format(R"(# template scale: {summary}; params {params}
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _block(dim, want, align):
    if want >= dim:
        return dim
    b = (want // align) * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * {c}


def workload(x):
    rows, cols = x.shape
    br, bc = _block(rows, {br}, 8), _block(cols, {bc}, 128)
    grid = ({grid})
    index = {index}
    return pl.pallas_call(
        _kernel,
        grid=grid,
        in_specs=[pl.BlockSpec((br, bc), index)],
        out_specs=pl.BlockSpec((br, bc), index),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes={vmem}),
    )(x)
)",
                       fmt::arg("summary", m.summary), fmt::arg("params", params.dump()),
                       fmt::arg("c", std::string(m.facts["c"])),
                       fmt::arg("br", params["block_rows"].get<int64_t>()),
                       fmt::arg("bc", params.value("block_cols", 512)),
                       fmt::arg("grid", cols_first ? "cols // bc, rows // br" : "rows // br, cols // bc"),
                       fmt::arg("index", cols_first ? "lambda j, i: (i, j)" : "lambda i, j: (i, j)"),
                       fmt::arg("vmem", params.value("vmem_limit_bytes", int64_t{32} << 20)));
  return true;
}

void build_graph(schema::DataflowGraph::Builder g, const std::string& primitive, int64_t rows,
                 int64_t cols) {
  auto in = g.initInputs(1);
  auto s = in[0].initShape(2);
  s.set(0, rows);
  s.set(1, cols);
  in[0].setDtype("float32");
  g.setOutputs(g.getInputs().asReader());
  auto n = g.initNodes(1)[0];
  n.setId(0);
  n.setPrimitive(primitive);
  n.setParams("{}");
  bool binary = primitive == "mul";
  auto ops = n.initOperands(binary ? 2 : 1);
  ops.setWithCaveats(0, in[0].asReader());
  if (binary)
    ops[1].setDtype("float32");
  n.setResults(g.getInputs().asReader());
  auto ids = n.initOperandIds(binary ? 2 : 1);
  auto inputs = n.initOperandInputs(binary ? 2 : 1);
  auto lits = n.initOperandLiterals(binary ? 2 : 1);
  ids.set(0, -1);
  inputs.set(0, 0);
  lits.set(0, "");
  if (binary) {
    ids.set(1, -1);
    inputs.set(1, -1);
    lits.set(1, "2.0");
  }
  n.setCount(1);
  auto out_ids = g.initOutputIds(1);
  out_ids.set(0, 0);
  auto out_inputs = g.initOutputInputs(1);
  out_inputs.set(0, -1);
}

}  // namespace maxkernel::tests
