#include "search/selection_policy.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

namespace maxkernel::search {

namespace {

// SplitMix64's finalizer: a fixed, portable mix (std::hash and std::rand are neither).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t tie_hash(uint64_t seed, unsigned round, uint32_t index) {
  return mix(mix(mix(seed) ^ round) ^ index);
}

bool timed(const frontier_entry& e) {
  return std::isfinite(e.time_us) && e.time_us > 0;
}

// The candidates in index order, one entry per index (the first of a full-field order when an
// index repeats, so that the input's order never matters).
std::vector<frontier_entry> canonical(const std::vector<frontier_entry>& in) {
  std::vector<frontier_entry> out = in;
  // A NaN would break the sort's ordering; an untimed vertex is 0 anyway.
  for (auto& e : out)
    if (!timed(e))
      e.time_us = 0;
  auto fields = [](const frontier_entry& e) {
    return std::tie(e.index, e.time_us, e.family, e.children, e.depth, e.exhausted, e.kernel);
  };
  std::sort(out.begin(), out.end(),
            [&](const frontier_entry& a, const frontier_entry& b) { return fields(a) < fields(b); });
  out.erase(std::unique(out.begin(), out.end(),
                        [](const frontier_entry& a, const frontier_entry& b) {
                          return a.index == b.index;
                        }),
            out.end());
  return out;
}

// Closes every timed vertex of a kernel but the fastest (the first on ties): a vertex whose
// kernel another vertex already is adds no new starting point. Closed like an exhausted
// vertex, so it still counts in bandit's best time and children total.
void close_repeated_kernels(std::vector<frontier_entry>& all) {
  std::map<std::string, size_t> kept;  // kernel -> its open entry
  for (size_t i = 0; i < all.size(); ++i) {
    auto& e = all[i];
    if (e.kernel.empty() || !timed(e))
      continue;
    auto [it, first] = kept.emplace(e.kernel, i);
    if (first)
      continue;
    auto& other = all[it->second];
    // Entries are in index order: on equal times the earlier one stays open.
    if (e.time_us < other.time_us) {
      other.exhausted = true;
      it->second = i;
    } else {
      e.exhausted = true;
    }
  }
}

std::vector<uint32_t> beam(const std::vector<frontier_entry>& all, unsigned width) {
  std::vector<const frontier_entry*> open;
  for (auto& e : all)
    if (!e.exhausted && timed(e))
      open.push_back(&e);
  std::stable_sort(open.begin(), open.end(), [](auto* a, auto* b) {
    return a->time_us != b->time_us ? a->time_us < b->time_us : a->index < b->index;
  });
  std::vector<uint32_t> out;
  for (size_t i = 0; i < open.size() && out.size() < width; ++i)
    out.push_back(open[i]->index);
  return out;
}

std::vector<uint32_t> bandit(const std::vector<frontier_entry>& all, unsigned width,
                             unsigned round, uint64_t seed) {
  // The best time and the children count are over every timed vertex given, exhausted ones
  // included: they are facts of the graph, not of what is still open.
  double best = 0;
  double total_children = 0;
  for (auto& e : all) {
    if (!timed(e))
      continue;
    if (best == 0 || e.time_us < best)
      best = e.time_us;
    total_children += e.children;
  }
  struct scored {
    const frontier_entry* entry;
    double base;  // exploitation + exploration
    uint64_t tie;
  };
  std::vector<scored> open;
  double log_total = std::log(total_children + 1);
  for (auto& e : all) {
    if (e.exhausted || !timed(e))
      continue;
    double exploit = std::log(best / e.time_us);
    double explore = bandit_exploration * std::sqrt(log_total / (e.children + 1.0));
    open.push_back({&e, exploit + explore, tie_hash(seed, round, e.index)});
  }
  std::vector<uint32_t> out;
  std::set<std::string> picked_families;
  while (out.size() < width && !open.empty()) {
    size_t pick = 0;
    double pick_score = 0;
    for (size_t i = 0; i < open.size(); ++i) {
      double score = open[i].base;
      if (!picked_families.count(open[i].entry->family))
        score += bandit_diversity;
      bool better = i == 0 || score > pick_score ||
                    (score == pick_score &&
                     std::tie(open[i].tie, open[i].entry->index) <
                         std::tie(open[pick].tie, open[pick].entry->index));
      if (better) {
        pick = i;
        pick_score = score;
      }
    }
    out.push_back(open[pick].entry->index);
    picked_families.insert(open[pick].entry->family);
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(pick));
  }
  return out;
}

}  // namespace

std::optional<policy_kind> parse_policy(std::string_view name) {
  if (name == "beam")
    return policy_kind::beam;
  if (name == "bandit")
    return policy_kind::bandit;
  return std::nullopt;
}

std::string_view policy_name(policy_kind policy) {
  return policy == policy_kind::beam ? "beam" : "bandit";
}

std::vector<uint32_t> select_frontier(policy_kind policy,
                                      const std::vector<frontier_entry>& candidates,
                                      unsigned width, unsigned round, uint64_t seed) {
  if (width == 0)
    return {};
  auto all = canonical(candidates);
  close_repeated_kernels(all);
  return policy == policy_kind::beam ? beam(all, width) : bandit(all, width, round, seed);
}

}  // namespace maxkernel::search
