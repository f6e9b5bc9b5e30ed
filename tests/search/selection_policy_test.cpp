// Frontier selection: beam takes the fastest open vertices; bandit trades speed against how
// often a vertex was expanded and favours new families; both are deterministic.
#include "search/selection_policy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace maxkernel::search {
namespace {

using ids = std::vector<uint32_t>;

frontier_entry entry(uint32_t index, double time_us, const std::string& family = "matmul",
                     uint32_t children = 0, bool exhausted = false) {
  frontier_entry e;
  e.index = index;
  e.time_us = time_us;
  e.family = family;
  e.children = children;
  e.depth = children > 0 ? 1 : 0;
  e.exhausted = exhausted;
  return e;
}

TEST(SelectionPolicy, ParsesItsNames) {
  EXPECT_EQ(parse_policy("beam"), policy_kind::beam);
  EXPECT_EQ(parse_policy("bandit"), policy_kind::bandit);
  EXPECT_EQ(parse_policy("Beam"), std::nullopt);
  EXPECT_EQ(parse_policy(""), std::nullopt);
  EXPECT_EQ(parse_policy("ucb"), std::nullopt);
  EXPECT_EQ(policy_name(policy_kind::bandit), "bandit");
  EXPECT_EQ(parse_policy(policy_name(policy_kind::beam)), policy_kind::beam);
}

TEST(SelectionPolicy, BeamTakesTheFastestOpenVertices) {
  std::vector<frontier_entry> c = {
      entry(0, 30), entry(1, 10, "matmul", 0, true),  // fastest, but exhausted
      entry(2, 20), entry(3, 0),                       // untimed: failed or not profiled
      entry(4, 15), entry(5, 20), entry(6, 40)};
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 3, 0, 1), (ids{4, 2, 5}));  // 2 and 5 tie
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 1, 0, 1), (ids{4}));
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 10, 0, 1), (ids{4, 2, 5, 0, 6}));
  EXPECT_TRUE(select_frontier(policy_kind::beam, c, 0, 0, 1).empty());
  EXPECT_TRUE(select_frontier(policy_kind::beam, {}, 4, 0, 1).empty());
  // Beam ignores how often a vertex was expanded and the seed.
  c[4].children = 50;
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 2, 7, 99), (ids{4, 2}));
}

TEST(SelectionPolicy, BanditExploitsWhileNothingWasExpanded) {
  std::vector<frontier_entry> c = {entry(0, 10), entry(1, 13), entry(2, 30)};
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 1, 0, 1), (ids{0}));
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 3, 0, 1), (ids{0, 1, 2}));
}

TEST(SelectionPolicy, BanditExploresAnUnexpandedSlowerVertex) {
  // The fast vertex has had 30 children, the one 1.3x slower none: bandit expands the slower
  // one, beam the fast one.
  std::vector<frontier_entry> c = {entry(0, 10, "matmul", 30), entry(1, 13, "matmul", 0)};
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 1, 3, 1), (ids{1}));
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 1, 3, 1), (ids{0}));
  // Exploration is bounded: a vertex 10x slower is not worth it.
  c[1].time_us = 100;
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 1, 3, 1), (ids{0}));
  // With few children on the fast vertex, speed wins.
  c[1].time_us = 13;
  c[0].children = 1;
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 1, 3, 1), (ids{0}));
}

TEST(SelectionPolicy, BanditPicksDiverseFamilies) {
  std::vector<frontier_entry> c = {entry(0, 10, "matmul"), entry(1, 10.5, "matmul"),
                                   entry(2, 11, "rowwise"), entry(3, 11.2, "rowwise")};
  // The second pick goes to the other family although vertex 1 is faster.
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 2, 0, 1), (ids{0, 2}));
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 2, 0, 1), (ids{0, 1}));
  // Once every family is picked, speed orders the rest.
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 4, 0, 1), (ids{0, 2, 1, 3}));
  // A family far slower does not win by novelty alone.
  c[2].time_us = c[3].time_us = 40;
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 2, 0, 1), (ids{0, 1}));
}

TEST(SelectionPolicy, BanditSkipsExhaustedAndUntimedVertices) {
  std::vector<frontier_entry> c = {entry(0, 10, "matmul", 0, true), entry(1, 0, "rowwise"),
                                   entry(2, 12, "matmul", 5)};
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 3, 0, 1), (ids{2}));
}

frontier_entry of_kernel(frontier_entry e, std::string kernel) {
  e.kernel = std::move(kernel);
  return e;
}

TEST(SelectionPolicy, OneKernelIsExpandedThroughItsFastestVertexOnly) {
  // 0, 2 and 3 are one kernel (2 made from 0 by a change the template resolved to the same
  // program): only 0 is open, the first of the equal times. 4 is slower than 5, its kernel.
  std::vector<frontier_entry> c = {
      of_kernel(entry(0, 10), "k1"), entry(1, 12), of_kernel(entry(2, 10), "k1"),
      of_kernel(entry(3, 10), "k1"), of_kernel(entry(4, 14), "k2"), of_kernel(entry(5, 13), "k2"),
      entry(6, 15)};
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 10, 0, 1), (ids{0, 1, 5, 6}));
  auto bandit = select_frontier(policy_kind::bandit, c, 10, 0, 1);
  EXPECT_EQ(std::set<uint32_t>(bandit.begin(), bandit.end()), (std::set<uint32_t>{0, 1, 5, 6}));
  // Without fingerprints every vertex is its own kernel.
  for (auto& e : c)
    e.kernel.clear();
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 10, 0, 1), (ids{0, 2, 3, 1, 5, 4, 6}));
}

TEST(SelectionPolicy, AKernelWhoseFastestVertexIsExhaustedIsClosed) {
  // The planner had no new move from 1; 0 is the same kernel, slower: its moves would make
  // the same kernels again, so nothing of k1 is open. Untimed vertices group with nothing.
  std::vector<frontier_entry> c = {of_kernel(entry(0, 11), "k1"),
                                   of_kernel(entry(1, 10, "matmul", 4, true), "k1"),
                                   of_kernel(entry(2, 0), "k1"), entry(3, 20)};
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 4, 0, 1), (ids{3}));
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 4, 0, 1), (ids{3}));
}

std::vector<frontier_entry> mixed_frontier() {
  std::vector<frontier_entry> c;
  const char* families[] = {"matmul", "rowwise", "flash_attention"};
  for (uint32_t i = 0; i < 14; ++i)
    c.push_back(entry(i, i % 4 == 3 ? 0 : 10 + (i % 5), families[i % 3], i % 3, i == 6));
  c[2].depth = 3;
  c[8].kernel = c[13].kernel = "one kernel";  // equal times: 13 closed, 8 open
  return c;
}

TEST(SelectionPolicy, TheInputOrderDoesNotMatter) {
  auto c = mixed_frontier();
  std::mt19937 shuffle_rng(7);
  for (auto policy : {policy_kind::beam, policy_kind::bandit}) {
    for (unsigned width : {1u, 3u, 6u, 20u}) {
      auto expected = select_frontier(policy, c, width, 2, 42);
      EXPECT_EQ(expected.size(), std::min<size_t>(width, 9));  // 9 timed and open
      for (int k = 0; k < 20; ++k) {
        auto shuffled = c;
        std::shuffle(shuffled.begin(), shuffled.end(), shuffle_rng);
        EXPECT_EQ(select_frontier(policy, shuffled, width, 2, 42), expected)
            << "policy " << policy_name(policy) << " width " << width;
      }
    }
  }
}

TEST(SelectionPolicy, BanditTiesFollowTheSeedAndRound) {
  // Eight identical vertices: every choice is a tie.
  std::vector<frontier_entry> c;
  for (uint32_t i = 0; i < 8; ++i)
    c.push_back(entry(i, 10, "matmul", 2));
  auto first = select_frontier(policy_kind::bandit, c, 3, 1, 1234);
  EXPECT_EQ(first.size(), 3u);
  EXPECT_EQ(std::set<uint32_t>(first.begin(), first.end()).size(), 3u);
  EXPECT_EQ(select_frontier(policy_kind::bandit, c, 3, 1, 1234), first);
  std::set<uint32_t> first_picks;
  for (uint64_t seed = 0; seed < 32; ++seed)
    first_picks.insert(select_frontier(policy_kind::bandit, c, 1, 1, seed)[0]);
  // Not a fixed index: the seed breaks the ties (32 seeds over 8 vertices).
  EXPECT_GE(first_picks.size(), 4u);
  std::set<uint32_t> by_round;
  for (unsigned round = 0; round < 32; ++round)
    by_round.insert(select_frontier(policy_kind::bandit, c, 1, round, 1234)[0]);
  EXPECT_GE(by_round.size(), 4u);
  // Beam breaks ties by index only.
  EXPECT_EQ(select_frontier(policy_kind::beam, c, 3, 1, 1234), (ids{0, 1, 2}));
}

}  // namespace
}  // namespace maxkernel::search
