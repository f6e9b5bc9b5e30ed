#include "agents/expert/playbook.hpp"

#include "agents/expert/block_size.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace maxkernel::agents::expert {
namespace {

constexpr const char* kVmemLimit = "vmem_limit_bytes";
constexpr double kMiB = 1024.0 * 1024.0;
// Share of the core's VMEM a kernel may claim (Mosaic keeps some for itself).
constexpr double kVmemUsable = 0.9;
// mergeFinding's rank: below the diagnosis's suggestions (10 and down, one per suggestion),
// above exploration (1 and down); the finding's gain orders the merges.
constexpr double kMergeScore = 5.0;
// Two times this close (relative) are one: a block step that changed nothing the model prices.
constexpr double kPlateau = 1e-4;
// A grid axis's dimension semantics (`dimension_semantics`, or one axis's `row_semantics`,
// `n_semantics`, ...): they only decide how a megacore device splits the grid across its
// TensorCores.
bool splits_cores(const tunable& t) {
  static const std::string suffix = "semantics";
  return t.what == tunable::kind::choice && t.name.size() >= suffix.size() &&
         t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t block_value(const nlohmann::json& params, const tunable& t) {
  auto it = params.find(t.name);
  if (it == params.end() || !it->is_number())
    return t.extent;
  return it->get<int64_t>();
}

int64_t effective(const nlohmann::json& params, const tunable& t) {
  return effective_block(t.extent, t.align, block_value(params, t));
}

bool exposes(const std::vector<tunable>& ts, const std::string& name) {
  return std::any_of(ts.begin(), ts.end(), [&](const tunable& t) { return t.name == name; });
}

struct builder {
  const kernel_template& t;
  const template_match& m;
  const nlohmann::json& parent;
  const config::chip& chip;
  const search_so_far& known;
  std::vector<tunable> ts;
  std::vector<move> out;
  std::set<std::string> offered;

  // The kernel the parent really is, and the child's, as effective values.
  std::string effective_key(const nlohmann::json& p) const {
    nlohmann::json e = p;
    for (const auto& tu : ts)
      if (tu.what == tunable::kind::block)
        e[tu.name] = effective(p, tu);
    return params_key(t.name(), e);
  }

  void offer(std::string name, nlohmann::json child, std::string rationale, std::string effect,
             double score) {
    if (!fit_vmem(t, m, child, chip))
      return;
    auto key = effective_key(child);
    if (key == effective_key(parent) || known.seen.count(params_key(t.name(), child)) ||
        known.seen.count(key) || offered.count(key))
      return;
    offered.insert(key);
    nlohmann::json changes = nlohmann::json::object();
    for (const auto& [k, v] : child.items())
      if (!parent.contains(k) || parent[k] != v)
        changes[k] = v;
    auto need = t.vmem_bytes(m, child);
    effect += fmt::format("; VMEM {:.1f} of {:.1f} MiB", need / kMiB,
                          vmem_limit(child, chip) / kMiB);
    out.push_back({std::move(name), std::move(child), std::move(changes), std::move(rationale),
                   std::move(effect), score});
  }

  const tunable* block_on_axis(int call, int axis) const {
    for (const auto& tu : ts)
      if (tu.what == tunable::kind::block && tu.grid_axis == axis && tu.call == call)
        return &tu;
    return nullptr;
  }

  // The block one step from `now` by `factor`: the next legal size up, or the size down
  // (at least the alignment); the value to set, which may equal `now` in effect.
  int64_t step_from(const tunable& tu, int64_t now, double factor) const {
    int64_t want = static_cast<int64_t>(std::llround(now * factor));
    if (factor > 1) {
      // The next legal size up: the smallest effective block above the current one.
      want = std::max(want, now + tu.align);
      int64_t e = effective_block(tu.extent, tu.align, want);
      while (e <= now && want < tu.extent) {
        want += tu.align;
        e = effective_block(tu.extent, tu.align, want);
      }
      return std::min(want, tu.extent);
    }
    return std::max<int64_t>(want, tu.align);
  }

  // The time of a kernel tried and correct; 0 when none is known.
  double timed_us(const nlohmann::json& p) const {
    for (const auto& key : {params_key(t.name(), p), effective_key(p)})
      if (auto it = known.timed.find(key); it != known.timed.end())
        return it->second;
    return 0;
  }

  void resize(const tunable& tu, double factor, const std::string& name, std::string why,
              double score) {
    int64_t now = effective(parent, tu);
    nlohmann::json child = parent;
    child[tu.name] = step_from(tu, now, factor);
    int64_t after = effective(child, tu);
    // A plateau: the step was tried and timed as the parent (the model's cost moves in
    // steps: block_s0 2 and 4 no faster than 1, 8 faster). Its own children are not opened
    // (docs/search-graph.md, one vertex per kernel), so the step is taken further from here.
    std::vector<int64_t> flat;
    while (after != now && known.parent_us > 0 && flat.size() < 8) {
      double us = timed_us(child);
      if (us <= 0 || std::abs(us - known.parent_us) > kPlateau * known.parent_us)
        break;
      flat.push_back(after);
      int64_t next = step_from(tu, after, factor);
      nlohmann::json further = child;
      further[tu.name] = next;
      if (effective(further, tu) == after)
        break;
      child = std::move(further);
      after = effective(child, tu);
    }
    if (after == now)
      return;
    if (!flat.empty())
      why += fmt::format(" ({} {} tried and timed as {}: a plateau, one step further)", tu.name,
                         fmt::join(flat, ", "), now);
    auto effect = fmt::format("{} {} -> {} ({}: {} -> {} blocks)", tu.name, now, after,
                              tu.meaning.empty() ? "steps" : tu.meaning,
                              (tu.extent + now - 1) / now, (tu.extent + after - 1) / after);
    offer(name, std::move(child), std::move(why), std::move(effect), score);
  }

  void choose(const tunable& tu, const nlohmann::json& value, const std::string& name,
              std::string why, double score) {
    nlohmann::json child = parent;
    child[tu.name] = value;
    auto effect = fmt::format("{} {} -> {}", tu.name,
                              parent.contains(tu.name) ? parent[tu.name].dump() : "default",
                              value.dump());
    offer(name, std::move(child), std::move(why), std::move(effect), score);
  }

  const tunable* largest_block() const {
    const tunable* best = nullptr;
    for (const auto& tu : ts)
      if (tu.what == tunable::kind::block && effective(parent, tu) > tu.align &&
          (!best || effective(parent, tu) > effective(parent, *best)))
        best = &tu;
    return best;
  }

  const tunable* choice_named(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      for (const auto& tu : ts)
        if (tu.what == tunable::kind::choice && tu.name == n)
          return &tu;
    return nullptr;
  }

  void next_choices(const tunable& tu, const std::string& name, const std::string& why,
                    double score) {
    for (const auto& c : tu.choices)
      if (!parent.contains(tu.name) || parent[tu.name] != c)
        choose(tu, c, name, why, score);
  }

  void from_suggestion(schema::Suggestion::Reader s, double score) {
    std::string why = s.getRationale().cStr();
    int call = std::max(0, s.getCallIndex());
    double factor = s.getFactor() > 0 ? s.getFactor() : 2.0;
    switch (s.getKind()) {
      case schema::SuggestionKind::GROW_BLOCK:
      case schema::SuggestionKind::REDUCE_STEPS:
        if (auto* tu = block_on_axis(call, s.getAxis()))
          resize(*tu, factor, s.getKind() == schema::SuggestionKind::GROW_BLOCK ? "growBlock"
                                                                              : "reduceSteps",
                 why, score);
        else  // no block on that axis: grow every block of the call a step
          for (const auto& tu : ts)
            if (tu.what == tunable::kind::block && tu.call == call)
              resize(tu, 2.0, "growBlock", why, score - 0.01);
        break;
      case schema::SuggestionKind::SHRINK_BLOCK:
        if (auto* tu = largest_block())
          resize(*tu, 1.0 / factor, "shrinkBlock", why, score);
        break;
      case schema::SuggestionKind::RAISE_VMEM_LIMIT:
        if (exposes(ts, kVmemLimit)) {
          nlohmann::json child = parent;
          int64_t now = vmem_limit(parent, chip);
          int64_t cap = static_cast<int64_t>(chip.vmem_bytes * kVmemUsable);
          child[kVmemLimit] = std::min<int64_t>(cap, static_cast<int64_t>(now * factor));
          offer("raiseVmemLimit", std::move(child), why,
                fmt::format("vmem_limit_bytes {:.0f} -> {:.0f} MiB", now / kMiB,
                            std::min<double>(cap, now * factor) / kMiB),
                score);
        }
        break;
      case schema::SuggestionKind::REORDER_GRID:
        if (auto* tu = choice_named({"grid_order"}))
          next_choices(*tu, "reorderGrid", why, score);
        break;
      case schema::SuggestionKind::PARALLEL_SEMANTICS:
        for (const auto& tu : ts)
          if (splits_cores(tu))
            next_choices(tu, "parallelSemantics", why, score);
        break;
      case schema::SuggestionKind::ALIGN_TO_MXU:
        for (const auto& tu : ts) {
          if (tu.what != tunable::kind::block)
            continue;
          int64_t now = effective(parent, tu);
          int64_t edge = std::max<int64_t>(chip.mxu_size, tu.align);
          if (now % edge != 0 && now > edge)
            resize(tu, static_cast<double>((now / edge) * edge) / now, "alignToMxu", why,
                   score);
          else if (now < edge && tu.extent >= edge)
            resize(tu, static_cast<double>(edge) / now, "alignToMxu", why, score);
        }
        break;
      case schema::SuggestionKind::FUSE_OUTSIDE_WORK:
        if (auto* tu = choice_named({"fuse", "fuse_epilogue", "fuse_outside"}))
          next_choices(*tu, "fuseOutsideWork", why, score);
        break;
      default:
        break;
    }
  }

  // Each finding's values on this candidate: a change measured faster elsewhere in the
  // search (another branch, or an earlier step of this one) is a better bet than a blind
  // step, and on coupled blocks it reaches kernels two or more moves away.
  void merges(const std::vector<finding>& findings, double score) {
    for (const auto& f : findings) {
      nlohmann::json child = parent;
      std::vector<std::string> parts;
      for (const auto& [k, v] : f.changes.items()) {
        if (!exposes(ts, k) || (parent.contains(k) && parent[k] == v))
          continue;
        // A number goes the way the finding moved it, never back: a candidate past the
        // finding's value (block_m 64 where the finding shrank it 512 -> 256) keeps its own.
        if (v.is_number() && f.before.contains(k) && f.before[k].is_number() &&
            parent.contains(k) && parent[k].is_number() &&
            (v.get<double>() < f.before[k].get<double>()) !=
                (v.get<double>() < parent[k].get<double>()))
          continue;
        parts.push_back(fmt::format("{} {} -> {}", k,
                                    parent.contains(k) ? parent[k].dump() : "default", v.dump()));
        child[k] = v;
      }
      if (parts.empty())
        continue;
      offer("mergeFinding", std::move(child),
            fmt::format("merge: {} made candidate {} {:.1f}% faster than its parent {} "
                        "({:.1f} -> {:.1f} us); the same values here",
                        f.changes.dump(), f.child_id.substr(0, 8), 100 * f.gain(),
                        f.parent_id.substr(0, 8), f.parent_us, f.child_us),
            fmt::format("{}", fmt::join(parts, ", ")), score + std::clamp(f.gain(), 0.0, 0.99));
    }
  }

  void exploration(double score) {
    // Blocks one step up and down, then every other value of each choice.
    for (const auto& tu : ts)
      if (tu.what == tunable::kind::block) {
        resize(tu, 2.0, "growBlock",
               fmt::format("explore: larger {} (fewer grid steps, more reuse per block)",
                           tu.name),
               score);
        resize(tu, 0.5, "shrinkBlock",
               fmt::format("explore: smaller {} (less VMEM, more pipelining)", tu.name),
               score - 0.05);
      }
    // On a device of one TensorCore (v5e, v6e, each v7x chiplet) every core split compiles to
    // the same schedule: measuring one would spend an evaluation on a copy of the parent.
    for (const auto& tu : ts)
      if (tu.what == tunable::kind::choice && tu.name != kVmemLimit &&
          !(splits_cores(tu) && !chip.megacore))
        next_choices(tu, "choice",
                     fmt::format("explore: another {}{}", tu.name,
                                 tu.meaning.empty() ? "" : " (" + tu.meaning + ")"),
                     score - 0.1);
    // A small space (a block already whole, no choice that changes the kernel): jump two
    // steps, then three, so a candidate still gets three distinct children to measure.
    for (double jump : {4.0, 8.0})
      if (out.size() < 3)
        for (const auto& tu : ts)
          if (tu.what == tunable::kind::block) {
            resize(tu, 1.0 / jump, "shrinkBlock",
                   fmt::format("explore: much smaller {} (a finer grid to pipeline and to "
                               "split across cores)", tu.name),
                   score - 0.2);
            resize(tu, jump, "growBlock",
                   fmt::format("explore: much larger {} (far fewer grid steps)", tu.name),
                   score - 0.2);
          }
  }
};

}  // namespace

std::string params_key(const std::string& template_name, const nlohmann::json& params) {
  // The VMEM limit decides whether a kernel compiles, not what it computes or how fast: two
  // param sets that differ only there are one kernel (a search would evaluate it twice).
  nlohmann::json p = params;
  if (p.is_object())
    p.erase(kVmemLimit);
  return template_name + ":" + p.dump();  // nlohmann orders object keys
}

int64_t vmem_limit(const nlohmann::json& params, const config::chip& chip) {
  auto it = params.find(kVmemLimit);
  if (it != params.end() && it->is_number() && it->get<int64_t>() > 0)
    return it->get<int64_t>();
  return static_cast<int64_t>(chip.scoped_vmem_bytes);
}

bool fit_vmem(const kernel_template& t, const template_match& m, nlohmann::json& params,
              const config::chip& chip) {
  int64_t need = t.vmem_bytes(m, params);
  if (need <= vmem_limit(params, chip))
    return true;
  auto cap = static_cast<int64_t>(chip.vmem_bytes * kVmemUsable);
  if (need > cap || !exposes(t.tunables(m), kVmemLimit))
    return false;
  // Headroom over the estimate, rounded up to whole MiB.
  int64_t mib = 1 << 20;
  int64_t limit = std::min(cap, ((need + need / 4 + mib - 1) / mib) * mib);
  params[kVmemLimit] = limit;
  return true;
}

std::vector<move> playbook_moves(const kernel_template& t, const template_match& m,
                                 const nlohmann::json& params, const config::chip& chip,
                                 const schema::Diagnosis::Reader* diagnosis,
                                 const search_so_far& known) {
  builder b{t, m, params, chip, known, t.tunables(m), {}, {}};
  if (diagnosis) {
    auto suggestions = diagnosis->getSuggestions();
    for (unsigned i = 0; i < suggestions.size(); ++i)
      b.from_suggestion(suggestions[i], 10.0 - i);
  }
  b.merges(known.findings, kMergeScore);
  b.exploration(1.0);
  std::stable_sort(b.out.begin(), b.out.end(),
                   [](const move& a, const move& c) { return a.score > c.score; });
  return b.out;
}

}  // namespace maxkernel::agents::expert
