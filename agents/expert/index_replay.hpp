// Replays index-only values of the reference (built from iota, literals, arithmetic, selects,
// broadcasts and reductions: decay matrices, masks and their row sums) as whole-array jnp
// code a kernel module runs outside its pallas_calls. Sizes are written through `sizes`
// (config-0 extent -> Python expression), so the code follows the shapes it runs at; a size
// with no expression stays a literal. Also places such a value onto the dims of another
// value it is combined with downstream (forward through broadcasts and elementwise ops), to
// tell a kernel which axes a precomputed row statistic runs along.
#pragma once

#include "agents/expert/graph_view.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace maxkernel::agents::expert::graph_facts {

// Statements computing `outputs` (names t<id>), or false with `why`.
bool replay_index_only(const graph_view& graph, const std::vector<int>& outputs,
                       const std::map<int64_t, std::string>& sizes, std::string& code,
                       std::string& why);

// What a replay may read besides literals: graph inputs and node results computed
// elsewhere (a kernel's outputs), as Python expressions.
struct replay_sources {
  std::map<int, std::string> inputs;                  // graph input -> expression
  std::map<std::pair<int, int>, std::string> results; // (node, result index) -> expression
};

// The same for values that may read `sources`: small post-processing around a kernel (the
// sampling after a top-k). Operands of multi-result nodes are told apart by their type.
// Also replays gathers (take_along_axis and the like) with their dimension numbers.
bool replay_values(const graph_view& graph, const std::vector<int>& outputs,
                   const std::map<int64_t, std::string>& sizes, const replay_sources& sources,
                   std::string& code, std::string& why);

// The expression of a value in replayed code (a literal, a source, or t<id>); "" if none.
std::string replayed(const graph_view& graph, const value_ref& v, const replay_sources& sources,
                     int node_result = -1);

// For each dim of node `from`: the dim of a value of shape `target_shape` that it lands on
// when `from` flows (through broadcast_in_dim, unit reshapes, casts and elementwise ops) into
// a node that combines it with a value of `anchor` (a node the target-shaped chain depends
// on); -1 for unit dims. Empty when no such path is found.
std::vector<int> place_forward(const graph_view& graph, int from,
                               const std::vector<int64_t>& target_shape, int anchor);

}  // namespace maxkernel::agents::expert::graph_facts
