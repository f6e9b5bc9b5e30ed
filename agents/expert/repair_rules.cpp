#include "agents/expert/repair_rules.hpp"

#include "agents/expert/block_size.hpp"
#include "agents/expert/playbook.hpp"

#include <capnp/schema.h>
#include <fmt/format.h>

#include <algorithm>

namespace maxkernel::agents::expert {
namespace {

int64_t value_of(const nlohmann::json& p, const tunable& t) {
  auto it = p.find(t.name);
  int64_t v = (it != p.end() && it->is_number()) ? it->get<int64_t>() : t.extent;
  return effective_block(t.extent, t.align, v);
}

std::string first_line(const std::string& s) {
  auto nl = s.find('\n');
  std::string line = s.substr(0, nl);
  return line.size() > 200 ? line.substr(0, 200) + "..." : line;
}

bool contains_any(const std::string& hay, std::initializer_list<const char*> needles) {
  std::string lower = hay;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  return std::any_of(needles.begin(), needles.end(),
                     [&](const char* n) { return lower.find(n) != std::string::npos; });
}

struct attempt {
  const kernel_template& t;
  const template_match& m;
  const nlohmann::json& params;
  const config::chip& chip;
  const std::set<std::string>& tried;
  std::vector<tunable> ts = t.tunables(m);
  repair result;

  // Accepts `child` under `fix` unless tried before, unchanged, or beyond VMEM.
  bool accept(nlohmann::json child, const std::string& fix) {
    if (tried.count(fix) || child == params)
      return false;
    if (!fit_vmem(t, m, child, chip))
      return false;
    result.repaired = true;
    result.params = std::move(child);
    result.fix = fix;
    return true;
  }

  bool resize(const tunable& tu, int64_t want, const std::string& cls, const char* verb) {
    int64_t now = value_of(params, tu);
    nlohmann::json child = params;
    child[tu.name] = want;
    int64_t after = value_of(child, tu);
    if (after == now)
      return false;
    return accept(child, fmt::format("{}: {} {} {} -> {}", cls, verb, tu.name, now, after));
  }

  const tunable* choice(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      for (const auto& tu : ts)
        if (tu.what == tunable::kind::choice && tu.name == n)
          return &tu;
    return nullptr;
  }

  bool realign(const std::string& cls) {
    nlohmann::json child = params;
    std::vector<std::string> changed;
    for (const auto& tu : ts) {
      if (tu.what != tunable::kind::block)
        continue;
      int64_t now = value_of(params, tu);
      // The largest multiple of the lane width dividing the dimension, at most the block:
      // legal for every dtype's sublane packing and for the lane axis; else the whole dim.
      int64_t lane = std::max<int64_t>(tu.align, chip.lanes);
      int64_t want = tu.extent;
      for (int64_t b = (now / lane) * lane; b >= lane; b -= lane)
        if (tu.extent % b == 0) {
          want = b;
          break;
        }
      child[tu.name] = want;
      int64_t after = value_of(child, tu);
      if (after != now)
        changed.push_back(fmt::format("{} {} -> {}", tu.name, now, after));
    }
    if (!changed.empty() &&
        accept(child, fmt::format("{}: realign blocks to the lane width ({})", cls,
                                  fmt::join(changed, ", "))))
      return true;
    // Whole-dimension blocks are always legal: try the smallest dimensions first.
    std::vector<const tunable*> blocks;
    for (const auto& tu : ts)
      if (tu.what == tunable::kind::block && value_of(params, tu) != tu.extent)
        blocks.push_back(&tu);
    std::sort(blocks.begin(), blocks.end(),
              [](const tunable* a, const tunable* b) { return a->extent < b->extent; });
    for (const auto* tu : blocks)
      if (resize(*tu, tu->extent, cls, "use the whole dimension for"))
        return true;
    return false;
  }

  bool shrink_largest(const std::string& cls, bool reduction_only) {
    std::vector<const tunable*> blocks;
    for (const auto& tu : ts)
      if (tu.what == tunable::kind::block && (!reduction_only || tu.reduction) &&
          value_of(params, tu) > tu.align)
        blocks.push_back(&tu);
    std::sort(blocks.begin(), blocks.end(), [&](const tunable* a, const tunable* b) {
      return value_of(params, *a) > value_of(params, *b);
    });
    for (const auto* tu : blocks)
      if (resize(*tu, value_of(params, *tu) / 2, cls, "shrink"))
        return true;
    return false;
  }

  bool raise_limit(const std::string& cls) {
    nlohmann::json child = params;
    int64_t now = vmem_limit(params, chip);
    auto cap = static_cast<int64_t>(chip.vmem_bytes * 0.9);
    int64_t want = std::min(cap, std::max(now * 2, t.vmem_bytes(m, params) * 5 / 4));
    bool exposed = std::any_of(ts.begin(), ts.end(),
                               [](const tunable& tu) { return tu.name == "vmem_limit_bytes"; });
    if (!exposed || want <= now)
      return false;
    child["vmem_limit_bytes"] = want;
    return accept(child, fmt::format("{}: raise vmem_limit_bytes {:.0f} -> {:.0f} MiB", cls,
                                     now / 1048576.0, want / 1048576.0));
  }

  bool grow_for_fewer_steps(const std::string& cls) {
    for (const auto& tu : ts)
      if (tu.what == tunable::kind::block && value_of(params, tu) < tu.extent &&
          resize(tu, value_of(params, tu) * 2, cls, "grow (fewer steps)"))
        return true;
    return false;
  }

  bool set_choice(std::initializer_list<const char*> names, const std::string& cls,
                  const std::string& what) {
    const tunable* tu = choice(names);
    if (!tu)
      return false;
    for (const auto& c : tu->choices) {
      if (params.contains(tu->name) && params[tu->name] == c)
        continue;
      nlohmann::json child = params;
      child[tu->name] = c;
      if (accept(child, fmt::format("{}: {} ({} -> {})", cls, what, tu->name, c.dump())))
        return true;
    }
    return false;
  }

  bool restart_from_initial(const std::string& cls) {
    return accept(t.initial_params(m, chip),
                  fmt::format("{}: back to the template's initial parameters", cls));
  }
};

}  // namespace

repair repair_params(const kernel_template& t, const template_match& m,
                     const nlohmann::json& params, const config::chip& chip,
                     schema::EvalResult::Reader failed, const std::set<std::string>& tried) {
  attempt a{t, m, params, chip, tried, t.tunables(m), {}};
  std::string cls = failure_class(failed);
  std::string msg = failure_message(failed);
  a.result.reason = fmt::format("{}: {}", cls, first_line(msg));
  bool done = false;
  if (cls == "lowerBlockShape") {
    done = a.realign(cls);
  } else if (cls == "vmemOom" || (cls == "resourceLimit" && contains_any(msg, {"vmem"}))) {
    done = a.raise_limit(cls) || a.shrink_largest(cls, false);
  } else if (cls == "resourceLimit" && contains_any(msg, {"out of memory", "memoryerror"})) {
    // The test's host memory: interpret mode materialises whole blocks (and their
    // broadcasts) per grid step, so smaller blocks are what fits.
    done = a.shrink_largest(cls, false);
  } else if (contains_any(msg, {"revisit", "revisited"})) {
    done = a.set_choice({"grid_order"}, cls, "reduction axis last");
  } else if (cls == "mismatch" || cls == "nonFinite") {
    done = a.set_choice({"accumulate", "accumulator", "precision"}, cls,
                        "f32 accumulation / higher precision") ||
           a.shrink_largest(cls, true);
  } else if (cls == "timeout") {
    done = a.grow_for_fewer_steps(cls);
  } else if (cls == "lowerError" || cls == "lowerVerification" || cls == "lowerUnsupported" ||
             cls == "runtimeError" || cls == "traceError" || cls == "wrongOutput") {
    done = a.restart_from_initial(cls) || a.realign(cls);
  }
  if (!done) {
    a.result.repaired = false;
    a.result.reason += done ? "" : "; no repair rule applies (or every fix was tried)";
  }
  return a.result;
}

}  // namespace maxkernel::agents::expert
