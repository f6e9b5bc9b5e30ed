#include "agents/diagnosis.hpp"

#include "maxkernel/schema/common.capnp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace maxkernel::agents {
namespace {

using schema::SuggestionKind;

constexpr double mib = 1024.0 * 1024.0;
// Thresholds of the rules (docs/agents.md). A call below `call_share_min` of the kernel's
// time is not worth a suggestion of its own.
constexpr double call_share_min = 0.1;
constexpr double outside_share_min = 0.2;   // of the kernel's time, for fuseOutsideWork
constexpr double reread_min = 1.5;          // copies per block before growing pays
constexpr double mxu_waste_min = 0.1;       // share of MXU work that is padding
constexpr double compute_share_min = 0.5;   // padding matters when compute sets the pace
constexpr double exposed_share_min = 0.3;   // exposed copies of the call's time
constexpr double few_steps = 4;             // too few steps to pipeline
constexpr double target_steps = 8;
constexpr double low_bandwidth = 0.5;       // of the peak HBM bandwidth

struct suggestion {
  SuggestionKind kind = SuggestionKind::NONE;
  int call = -1;
  std::string role;
  int index = -1;
  int axis = -1;
  double factor = 0;
  std::string rationale;
};

struct call_view {
  int index;
  schema::CallProfile::Reader prof;
  std::optional<schema::PallasCall::Reader> structure;
};

const char* role_name(schema::OperandRole r) {
  switch (r) {
    case schema::OperandRole::INPUT: return "input";
    case schema::OperandRole::OUTPUT: return "output";
    case schema::OperandRole::SCALAR_PREFETCH: return "scalarPrefetch";
  }
  return "input";
}

double pct(double x) { return 100.0 * x; }

// Factors are capped: a measured or hand-made profile may carry infinities or NaN.
constexpr double factor_max = 1u << 30;

// Largest power of two <= x (1 when x < 2 or NaN), at most factor_max.
double pow2_floor(double x) {
  x = std::isnan(x) ? 1 : std::min(x, factor_max);
  double f = 1;
  while (f * 2 <= x)
    f *= 2;
  return f;
}

double pow2_ceil(double x) {
  x = std::isnan(x) ? 1 : std::min(x, factor_max);
  double f = 1;
  while (f < x)
    f *= 2;
  return f;
}

int64_t grid_at(schema::PallasCall::Reader c, int axis) {
  return axis >= 0 && static_cast<unsigned>(axis) < c.getGrid().size() ? c.getGrid()[axis] : 1;
}

bool depends_on(schema::Operand::Reader op, unsigned axis) {
  for (auto d : op.getDependence())
    if (d.getAxis() == axis)
      return d.getKind() != schema::DepKind::NONE;
  return false;
}

std::optional<schema::Operand::Reader> find_operand(schema::PallasCall::Reader c,
                                                    const std::string& role, uint32_t index) {
  for (auto op : c.getOperands())
    if (role == role_name(op.getRole()) && op.getIndex() == index)
      return op;
  return std::nullopt;
}

// Blocks that tile the whole array (a squeezed dimension, -1, counts one block per element).
double blocks_in_array(schema::Operand::Reader op) {
  auto shape = op.getType().getShape();
  auto block = op.getBlockShape();
  if (shape.size() != block.size())
    return 0;
  double n = 1;
  for (unsigned d = 0; d < shape.size(); ++d) {
    int64_t b = block[d] < 0 ? 1 : block[d];
    if (b <= 0)
      return 0;
    n *= static_cast<double>((shape[d] + b - 1) / b);
  }
  return n;
}

// The grid axis along which the operand is copied again although its block does not move
// along it: a faster axis it depends on wraps at each of its steps. Of those, the one
// causing the most copies; -1 when there is none.
int reread_axis(schema::PallasCall::Reader c, schema::Operand::Reader op) {
  auto grid = c.getGrid();
  int best = -1;
  double best_copies = 0, slower = 1;
  for (unsigned a = 0; a < grid.size(); ++a) {
    bool faster_dep = false;
    for (unsigned b = a + 1; b < grid.size(); ++b)
      faster_dep = faster_dep || (grid[b] > 1 && depends_on(op, b));
    double copies = slower * static_cast<double>(grid[a] - 1);
    if (grid[a] > 1 && !depends_on(op, a) && faster_dep && copies > best_copies) {
      best = static_cast<int>(a);
      best_copies = copies;
    }
    slower *= static_cast<double>(std::max<int64_t>(grid[a], 1));
  }
  return best;
}

// VMEM that growing the blocks along `axis` 2x adds: the buffers of the operands whose
// block moves along it (their block grows with the axis's block).
double axis_buffer_bytes(schema::PallasCall::Reader c, int axis) {
  double bytes = 0;
  for (auto op : c.getOperands())
    if (axis >= 0 && depends_on(op, static_cast<unsigned>(axis)))
      bytes += static_cast<double>(op.getBlockBytes()) * std::max(op.getBuffering(), 1u);
  return bytes;
}

// The power-of-two growth along an axis that fits `limit` and the axis's steps.
double growth_factor(double peak, double limit, double per_doubling, double steps) {
  double f = per_doubling > 0 ? 1 + (limit - peak) / per_doubling : steps;
  return pow2_floor(std::min(f, steps));
}

// Moving `axis` innermost must not make any output block be revisited: an output's block
// may stay put only along axes that come after every axis it moves along.
bool reorder_valid(schema::PallasCall::Reader c, int axis) {
  std::vector<unsigned> order;
  for (unsigned a = 0; a < c.getGrid().size(); ++a)
    if (static_cast<int>(a) != axis)
      order.push_back(a);
  order.push_back(static_cast<unsigned>(axis));
  for (auto op : c.getOperands()) {
    if (op.getRole() != schema::OperandRole::OUTPUT)
      continue;
    bool still = false;
    for (auto a : order) {
      if (c.getGrid()[a] <= 1)
        continue;
      if (!depends_on(op, a))
        still = true;
      else if (still)
        return false;
    }
  }
  return true;
}

class diagnoser {
public:
  diagnoser(schema::Profile::Reader profile, const config::chip& chip)
    : p_(profile), chip_(chip) {}

  void call(const call_view& v, std::vector<suggestion>& out) const {
    parallel(v, out);
    auto bound = std::string(v.prof.getBound().cStr());
    if (bound == "memory")
      memory(v, out);
    else if (bound == "overhead")
      overhead(v, out);
    align(v, out);
  }

  void outside(std::vector<suggestion>& out, double share) const {
    suggestion s;
    s.kind = SuggestionKind::FUSE_OUTSIDE_WORK;
    s.rationale = fmt::format(
        "{:.1f} of {:.1f} us ({:.0f}%) is XLA work outside the pallas_calls: fuse it into the "
        "kernel (up to {:.1f} us to gain)",
        p_.getOutsideUs(), p_.getTimeUs(), pct(share), p_.getOutsideUs());
    out.push_back(std::move(s));
  }

private:
  double vmem_limit(const call_view& v) const {
    if (v.structure && v.structure->getVmemLimitBytes() > 0)
      return static_cast<double>(v.structure->getVmemLimitBytes());
    return static_cast<double>(chip_.scoped_vmem_bytes);
  }

  double bandwidth_share(const call_view& v) const {
    double peak = chip_.hbm_bandwidth * chip_.device_share();
    double t = v.prof.getTimeUs();
    return t > 0 && peak > 0 ? v.prof.getHbmBytes() / (t * 1e-6) / peak : 0;
  }

  std::string vmem_room(double peak, double limit, double f) const {
    return fmt::format("VMEM {:.1f} of {:.1f} MiB leaves room for {:.0f}x", peak / mib,
                       limit / mib, f);
  }

  // Grows along `axis` when VMEM allows 2x or more; otherwise raises the VMEM limit when the
  // core's physical VMEM would allow it. False when neither applies.
  bool grow_or_raise(const call_view& v, SuggestionKind kind, int axis, double per_doubling,
                     double steps, const std::string& head, const std::string& what,
                     suggestion base, std::vector<suggestion>& out) const {
    double peak = static_cast<double>(v.prof.getVmemBytes());
    double limit = vmem_limit(v);
    double physical = static_cast<double>(chip_.vmem_bytes);
    double f = growth_factor(peak, limit, per_doubling, steps);
    base.call = v.index;
    base.axis = axis;
    if (f >= 2) {
      base.kind = kind;
      base.factor = f;
      base.rationale = fmt::format("{}: {} {:.0f}x; {}", head, what, f, vmem_room(peak, limit, f));
      out.push_back(std::move(base));
      return true;
    }
    double f_physical = growth_factor(peak, physical, per_doubling, steps);
    if (limit > 0 && limit < physical && f_physical >= 2) {
      base.kind = SuggestionKind::RAISE_VMEM_LIMIT;
      base.factor = physical / limit;
      base.rationale = fmt::format(
          "{}: VMEM {:.1f} of {:.1f} MiB is too full to {} 2x; raise vmem_limit_bytes to "
          "{:.1f} MiB (the core's physical VMEM), room for {:.0f}x",
          head, peak / mib, limit / mib, what, physical / mib, f_physical);
      out.push_back(std::move(base));
      return true;
    }
    return false;
  }

  void parallel(const call_view& v, std::vector<suggestion>& out) const {
    unsigned cores = chip_.cores_per_device;
    unsigned used = v.prof.getCoresUsed();
    if (!chip_.megacore || cores < 2 || used == 0 || used >= cores)
      return;
    int axis = -1;
    int64_t steps = 0;
    if (v.structure) {
      // A parallel axis must not be a reduction: every output's block moves along it.
      auto grid = v.structure->getGrid();
      for (unsigned a = 0; a < grid.size() && axis < 0; ++a) {
        if (grid[a] <= 1)
          continue;
        bool all = true;
        for (auto op : v.structure->getOperands())
          if (op.getRole() == schema::OperandRole::OUTPUT && !depends_on(op, a))
            all = false;
        if (all) {
          axis = static_cast<int>(a);
          steps = grid[a];
        }
      }
      if (axis < 0)
        return;
    }
    suggestion s;
    s.kind = SuggestionKind::PARALLEL_SEMANTICS;
    s.call = v.index;
    s.axis = axis;
    s.factor = static_cast<double>(cores) / used;
    s.rationale = fmt::format(
        "{} runs on {} of the device's {} TensorCores: mark grid axis {} ({} steps) parallel "
        "to split it across them (up to {:.0f}x on its {:.1f} us)",
        v.prof.getName().cStr(), used, cores, axis, steps, s.factor, v.prof.getTimeUs());
    out.push_back(std::move(s));
  }

  void memory(const call_view& v, std::vector<suggestion>& out) const {
    auto traffic = v.prof.getTraffic();
    if (traffic.size() == 0)
      return;
    unsigned dom = 0;
    double total = 0;
    for (unsigned i = 0; i < traffic.size(); ++i) {
      total += traffic[i].getBytes();
      if (traffic[i].getBytes() > traffic[dom].getBytes())
        dom = i;
    }
    auto t = traffic[dom];
    std::string role = t.getRole().cStr();
    suggestion base;
    base.role = role;
    base.index = static_cast<int>(t.getIndex());
    std::string head = fmt::format(
        "{} is memory-bound at {:.0f}% of HBM bandwidth; {} {} is copied {:.0f} times "
        "({:.1f} MiB of {:.1f} MiB traffic)",
        v.prof.getName().cStr(), pct(bandwidth_share(v)), role, t.getIndex(), t.getCopies(),
        t.getBytes() / mib, total / mib);
    double peak = static_cast<double>(v.prof.getVmemBytes());
    double limit = vmem_limit(v);

    std::optional<schema::Operand::Reader> op;
    if (v.structure)
      op = find_operand(*v.structure, role, t.getIndex());
    double blocks = op ? blocks_in_array(*op) : 0;
    double reread = blocks > 0 ? t.getCopies() / blocks : 0;
    if (op && reread >= reread_min) {
      int axis = reread_axis(*v.structure, *op);
      if (axis >= 0) {
        double steps = static_cast<double>(grid_at(*v.structure, axis));
        head += fmt::format(", {:.0f}x per block, re-read along grid axis {} ({:.0f} steps)",
                            reread, axis, steps);
        if (grow_or_raise(v, SuggestionKind::GROW_BLOCK, axis,
                          axis_buffer_bytes(*v.structure, axis), steps, head,
                          fmt::format("grow the blocks along axis {}", axis), base, out))
          return;
        if (reorder_valid(*v.structure, axis)) {
          base.kind = SuggestionKind::REORDER_GRID;
          base.call = v.index;
          base.axis = axis;
          base.rationale = fmt::format(
              "{}; VMEM {:.1f} of {:.1f} MiB leaves no room to grow: move axis {} innermost "
              "so its block stays resident",
              head, peak / mib, std::max(limit, static_cast<double>(chip_.vmem_bytes)) / mib,
              axis);
          out.push_back(std::move(base));
        }
        return;
      }
    }

    double time = v.prof.getTimeUs();
    double steps = v.prof.getSteps();
    double exposed = time > 0 ? v.prof.getExposedDmaUs() / time : 0;
    if (steps > 0 && steps <= few_steps && exposed >= exposed_share_min) {
      base.kind = SuggestionKind::SHRINK_BLOCK;
      base.call = v.index;
      base.factor = pow2_ceil(target_steps / steps);
      if (op)
        for (unsigned a = 0; a < v.structure->getGrid().size(); ++a)
          if (depends_on(*op, a)) {
            base.axis = static_cast<int>(a);
            break;
          }
      base.rationale = fmt::format(
          "{}: only {:.0f} grid steps, so {:.1f} of {:.1f} us of copies are not hidden behind "
          "compute: shrink its block {:.0f}x to pipeline the copies",
          head, steps, v.prof.getExposedDmaUs(), time, base.factor);
      out.push_back(std::move(base));
      return;
    }
    if (!v.structure && t.getCopies() > 1) {
      double per_doubling = peak;  // without the structure: every buffer grows
      grow_or_raise(v, SuggestionKind::GROW_BLOCK, -1, per_doubling, t.getCopies(), head,
                    "grow its block", base, out);
      return;
    }
    if (v.structure && bandwidth_share(v) < low_bandwidth && steps >= target_steps) {
      // Every block is copied once, but the copies are small: DMA latency sets the pace.
      auto grid = v.structure->getGrid();
      int axis = -1;
      for (unsigned a = 0; a < grid.size(); ++a)
        if (grid[a] > 1)
          axis = static_cast<int>(a);
      if (axis < 0)
        return;
      grow_or_raise(v, SuggestionKind::GROW_BLOCK, axis,
                    axis_buffer_bytes(*v.structure, axis),
                    static_cast<double>(grid[axis]), head + fmt::format(
                        ", each block once over {:.0f} small steps", steps),
                    fmt::format("grow the blocks along axis {}", axis), base, out);
    }
  }

  void overhead(const call_view& v, std::vector<suggestion>& out) const {
    std::string head = fmt::format(
        "{} is overhead-bound: {:.0f} grid steps per core, {:.1f} of {:.1f} us is per-step "
        "overhead",
        v.prof.getName().cStr(), v.prof.getSteps(), v.prof.getOverheadUs(), v.prof.getTimeUs());
    int axis = -1;
    double per_doubling = static_cast<double>(v.prof.getVmemBytes());
    double steps = v.prof.getSteps();
    if (v.structure) {
      auto grid = v.structure->getGrid();
      int64_t most = 1;
      for (unsigned a = 0; a < grid.size(); ++a)
        if (grid[a] > 1 && grid[a] >= most) {
          most = grid[a];
          axis = static_cast<int>(a);
        }
      if (axis < 0)
        return;
      per_doubling = axis_buffer_bytes(*v.structure, axis);
      steps = static_cast<double>(most);
    }
    grow_or_raise(v, SuggestionKind::REDUCE_STEPS, axis, per_doubling, steps, head,
                  fmt::format("take larger blocks along axis {} ({:.0f} steps)", axis, steps),
                  suggestion{}, out);
  }

  void align(const call_view& v, std::vector<suggestion>& out) const {
    if (!v.structure || chip_.mxu_size == 0)
      return;
    double time = v.prof.getTimeUs();
    bool compute_paced = std::string(v.prof.getBound().cStr()) == "compute" ||
                         (time > 0 && v.prof.getComputeUs() >= compute_share_min * time);
    if (!compute_paced)
      return;
    auto pad = [](int64_t x, int64_t to) { return to > 0 ? (x + to - 1) / to * to : x; };
    int64_t mxu = chip_.mxu_size, sub = chip_.sublanes;
    double worst = 0;
    schema::DotOp::Reader dot;
    for (auto d : v.structure->getStepDots()) {
      double useful = static_cast<double>(d.getM()) * d.getN() * d.getK();
      double padded = static_cast<double>(pad(d.getM(), sub)) * pad(d.getN(), mxu) *
                      pad(d.getK(), mxu);
      double waste = padded > 0 ? 1 - useful / padded : 0;
      if (waste > worst) {
        worst = waste;
        dot = d;
      }
    }
    if (worst < mxu_waste_min)
      return;
    suggestion s;
    s.kind = SuggestionKind::ALIGN_TO_MXU;
    s.call = v.index;
    s.factor = 1 / (1 - worst);
    // The input whose block carries an unaligned matmul dimension that a block size sets (the
    // block is a tile of a larger array dimension). A dimension carried only as an input's
    // whole extent is the task's (attention's head_dim 128 on a 256-wide MXU): no block choice
    // removes that padding, so the rationale says so and nothing is suggested.
    auto unaligned = [&](int64_t b) {
      return (b == dot.getN() && dot.getN() % mxu != 0) ||
             (b == dot.getK() && dot.getK() % mxu != 0);
    };
    int64_t whole = 0;
    for (auto op : v.structure->getOperands()) {
      if (op.getRole() != schema::OperandRole::INPUT || s.index >= 0)
        continue;
      auto block = op.getBlockShape();
      auto shape = op.getType().getShape();
      for (unsigned j = 0; j < block.size(); ++j) {
        if (!unaligned(block[j]))
          continue;
        if (j < shape.size() && shape[j] == block[j]) {
          whole = block[j];
          continue;
        }
        s.role = "input";
        s.index = static_cast<int>(op.getIndex());
        break;
      }
    }
    auto what = fmt::format(
        "{}'s per-step dot {}x{}x{} (m x n x k) pads to {}x{}x{} on the {}-wide MXU: {:.0f}% "
        "of its MXU work is padding",
        v.prof.getName().cStr(), dot.getM(), dot.getN(), dot.getK(), pad(dot.getM(), sub),
        pad(dot.getN(), mxu), pad(dot.getK(), mxu), mxu, pct(worst));
    if (s.index < 0 && whole > 0) {
      s.kind = SuggestionKind::NONE;
      s.factor = 0;
      s.rationale = fmt::format(
          "{}; {} is an input's whole dimension (the task's shape), so no block choice "
          "removes it",
          what, whole);
    } else {
      s.rationale = fmt::format("{}; make the block dims multiples of {}", what, mxu);
    }
    out.push_back(std::move(s));
  }

  schema::Profile::Reader p_;
  const config::chip& chip_;
};

}  // namespace

void diagnose(schema::ProfilerRequest::Reader request, const config::chip& chip,
              schema::Diagnosis::Builder out) {
  auto p = request.getProfile();
  auto calls = p.getCalls();
  std::optional<capnp::List<schema::PallasCall>::Reader> structure;
  if (request.getHasStructure())
    structure = request.getStructure().getPallasCalls();

  double time = p.getTimeUs();
  out.setSchemaVersion(schema::SCHEMA_VERSION);
  out.setTiming(p.getTiming());
  out.setChip(chip.name);
  out.setBound(p.getBound());
  out.setTimeUs(time);
  out.setRooflineUs(p.getRooflineUs());
  out.setHeadroom(time > 0 ? p.getRooflineUs() / time : 0);
  out.setHeadroomUs(std::max(0.0, time - p.getRooflineUs()));

  // Calls by time, slowest first (index breaks ties): the first is the bottleneck.
  std::vector<call_view> views;
  for (unsigned i = 0; i < calls.size(); ++i) {
    call_view v{static_cast<int>(i), calls[i], std::nullopt};
    if (structure && i < structure->size())
      v.structure = (*structure)[i];
    views.push_back(v);
  }
  std::stable_sort(views.begin(), views.end(), [](const call_view& a, const call_view& b) {
    return a.prof.getTimeUs() > b.prof.getTimeUs();
  });

  auto bottleneck = out.initBottleneckOperand();
  if (!views.empty()) {
    const auto& b = views.front();
    out.setBottleneckCall(b.index);
    out.setBottleneckCallName(b.prof.getName());
    auto traffic = b.prof.getTraffic();
    if (std::string(b.prof.getBound().cStr()) == "memory" && traffic.size() > 0) {
      unsigned dom = 0;
      for (unsigned i = 1; i < traffic.size(); ++i)
        if (traffic[i].getBytes() > traffic[dom].getBytes())
          dom = i;
      bottleneck.setRole(traffic[dom].getRole());
      bottleneck.setIndex(static_cast<int32_t>(traffic[dom].getIndex()));
    }
  }

  diagnoser d(p, chip);
  std::vector<suggestion> list;
  double outside_share = time > 0 ? p.getOutsideUs() / time : 0;
  double bottleneck_share = time > 0 && !views.empty() ? views.front().prof.getTimeUs() / time : 0;
  bool outside_first = outside_share >= outside_share_min && outside_share > bottleneck_share;
  if (outside_first)
    d.outside(list, outside_share);
  for (unsigned i = 0; i < views.size(); ++i)
    if (i == 0 || (time > 0 && views[i].prof.getTimeUs() >= call_share_min * time))
      d.call(views[i], list);
  if (!outside_first && outside_share >= outside_share_min)
    d.outside(list, outside_share);

  if (list.empty()) {
    suggestion s;
    s.rationale = fmt::format(
        "{}-bound at {:.0f}% of roofline ({:.1f} of {:.1f} us, {:.1f} us headroom): no rule of "
        "the profiler points to a change",
        p.getBound().cStr(), pct(out.getHeadroom()), p.getRooflineUs(), time,
        out.getHeadroomUs());
    list.push_back(std::move(s));
  }
  auto sl = out.initSuggestions(static_cast<unsigned>(list.size()));
  for (unsigned i = 0; i < list.size(); ++i) {
    const auto& s = list[i];
    auto b = sl[i];
    b.setKind(s.kind);
    b.setCallIndex(s.call);
    b.setOperandRole(s.role);
    b.setOperandIndex(s.index);
    b.setAxis(s.axis);
    b.setFactor(s.factor);
    b.setRationale(s.rationale);
  }
}

}  // namespace maxkernel::agents
