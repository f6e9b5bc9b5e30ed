// Evaluates, at one multi-index, a value of the reference that depends on no graph input:
// masks and decay matrices built from iota, comparisons, arithmetic, exp/log/pow, selects,
// broadcasts and reductions. Templates use it to recognise what such a value IS (a causal
// mask, gamma^(n-m) decay) by its values at sample points, whatever the spelling (jnp.tril,
// arange comparisons, where, pow or exp of a product, cumsum differences).
#pragma once

#include "agents/expert/graph_view.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace maxkernel::agents::expert::graph_facts {

class index_evaluator {
public:
  explicit index_evaluator(const graph_view& graph) : g_(graph) {}

  // The value of v at `index` (one entry per dim of v); nullopt when v depends on a graph
  // input or on a primitive this evaluator does not know.
  std::optional<double> at(const value_ref& v, const std::vector<int64_t>& index);

  // True when v depends on no graph input (only literals and index arithmetic).
  bool index_only(const value_ref& v);

private:
  std::optional<double> node_at(int id, const std::vector<int64_t>& index);
  const graph_view& g_;
  std::map<int, bool> index_only_;
  std::map<std::pair<int, std::vector<int64_t>>, std::optional<double>> memo_;
  int budget_ = 4'000'000;   // evaluations before giving up (a reduction over a huge axis)
};

}  // namespace maxkernel::agents::expert::graph_facts
