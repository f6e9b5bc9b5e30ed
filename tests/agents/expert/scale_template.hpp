// A small real template for the expert brain's tests: y = x * c for a 2-D float x and a
// scalar literal c, tiled (block_rows, block_cols) with a grid order choice. It renders a
// working Pallas kernel, so the brains' tests exercise real matching, params and rendering
// without depending on the production families. Also builds the graphs the tests match.
#pragma once

#include "agents/expert/kernel_template.hpp"

#include <capnp/message.h>

namespace maxkernel::tests {

class scale_template final : public agents::expert::kernel_template {
public:
  std::string name() const override { return "scale"; }
  std::string covers() const override { return "a 2-D array times a scalar"; }
  std::optional<agents::expert::template_match> match(
    const agents::expert::graph_view& g, schema::KernelSpec::Reader spec) const override;
  nlohmann::json initial_params(const agents::expert::template_match& m,
                                const config::chip& chip) const override;
  std::vector<agents::expert::tunable> tunables(
    const agents::expert::template_match& m) const override;
  int64_t vmem_bytes(const agents::expert::template_match& m,
                     const nlohmann::json& params) const override;
  bool render(const agents::expert::template_match& m, const nlohmann::json& params,
              std::string& source, std::string& error) const override;
};

// DataflowGraph of `x * c` (primitive "mul") or of `exp(x)` (primitive "exp"), x f32 [rows, cols].
void build_graph(schema::DataflowGraph::Builder g, const std::string& primitive, int64_t rows,
                 int64_t cols);

}  // namespace maxkernel::tests
