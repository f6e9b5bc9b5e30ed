// The graph search's frontier selection: which vertices a round expands. Deterministic: the
// choice depends only on the arguments, not on the order of the candidates or on a global RNG
// (formulas in docs/search-graph.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace maxkernel::search {

struct frontier_entry {
  uint32_t index = 0;     // vertex index
  double time_us = 0;     // > 0 for a correct, profiled vertex; others are never selected
  std::string family;     // template name (diversity)
  uint32_t children = 0;  // children already made from it
  uint32_t depth = 0;     // edges from its root
  bool exhausted = false; // the planner had no new move for it
  std::string kernel;     // search::kernel_fingerprint of its structure; "" when unknown
};

enum class policy_kind { beam, bandit };

// "beam" | "bandit"; nullopt for anything else.
std::optional<policy_kind> parse_policy(std::string_view name);
std::string_view policy_name(policy_kind policy);

// bandit's constants: the exploration weight c of the UCB term and the bonus of a family not
// yet picked in this selection, both in units of the exploitation term (ln best/time: a vertex
// 2x slower than the best scores -0.69).
inline constexpr double bandit_exploration = 0.5;
inline constexpr double bandit_diversity = 0.25;

// The vertices to expand this round (at most `width`), in expansion order. Vertices of one
// kernel (equal non-empty `kernel`) are expanded through one of them only, the fastest (ties:
// lower index): the planner's moves from the others make the same kernels again under other
// parameters. beam: the `width` fastest open vertices (ties: lower index). bandit: greedy by
// UCB score plus the diversity bonus, ties broken by a hash of (seed, round, index).
std::vector<uint32_t> select_frontier(policy_kind policy,
                                      const std::vector<frontier_entry>& candidates,
                                      unsigned width, unsigned round, uint64_t seed);

}  // namespace maxkernel::search
