#include "tpu_nodes/model/pallas_call_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace maxkernel::tpu_nodes::model {

namespace {

constexpr double mib = 1024.0 * 1024.0;

struct axis_plan {
  std::vector<int64_t> extent;      // per-core extents (the split axis halved)
  std::vector<double> transitions;  // steps at which axis a advances and faster axes wrap
  double steps = 1;                 // steps per core
  unsigned cores_used = 1;
  int split_axis = -1;
};

// Megacore chips shard the first "parallel" axis that has more than one step across their
// TensorCores; without one, a core idles.
axis_plan plan_axes(schema::PallasCall::Reader call, const device_rates& rates) {
  axis_plan plan;
  auto grid = call.getGrid();
  auto semantics = call.getDimensionSemantics();
  for (auto g : grid)
    plan.extent.push_back(std::max<int64_t>(g, 1));
  if (rates.chip->megacore && rates.cores > 1) {
    for (size_t a = 0; a < plan.extent.size() && a < semantics.size(); ++a) {
      std::string_view s = semantics[a].cStr();
      if ((s == "parallel" || s == "core_parallel") && plan.extent[a] > 1) {
        plan.split_axis = static_cast<int>(a);
        plan.cores_used = rates.cores;
        plan.extent[a] = (plan.extent[a] + rates.cores - 1) / rates.cores;
        break;
      }
    }
  }
  double prefix = 1;
  for (auto e : plan.extent) {
    plan.transitions.push_back(prefix * static_cast<double>(e - 1));
    prefix *= static_cast<double>(e);
  }
  plan.steps = prefix;
  return plan;
}

// Probability that an operand's block index changes at a transition of each axis: certain
// when a faster axis it depends on wraps around, else the axis's own change fraction.
std::vector<double> change_probability(schema::Operand::Reader op, const axis_plan& plan,
                                       bool& unknown) {
  size_t n = plan.extent.size();
  std::vector<double> own(n, 0.0);
  std::vector<bool> depends(n, false);
  auto deps = op.getDependence();
  unknown = n > 0 && deps.size() == 0;
  if (unknown) {
    std::fill(own.begin(), own.end(), 1.0);
    std::fill(depends.begin(), depends.end(), true);
  }
  for (auto d : deps) {
    if (d.getAxis() >= n || d.getKind() == schema::DepKind::NONE)
      continue;
    double f = d.getChangeFraction();
    own[d.getAxis()] = std::isfinite(f) ? std::clamp(f, 0.0, 1.0) : 1.0;
    depends[d.getAxis()] = true;
  }
  std::vector<double> p(n, 0.0);
  bool faster = false;
  for (size_t a = n; a-- > 0;) {
    p[a] = faster ? 1.0 : own[a];
    if (depends[a] && plan.extent[a] > 1)
      faster = true;
  }
  return p;
}

std::vector<int64_t> shape_of(capnp::List<int64_t>::Reader list) {
  std::vector<int64_t> shape;
  shape.reserve(list.size());
  for (auto d : list)
    shape.push_back(d);
  return shape;
}

bool pipelined(std::string_view space) { return space == "vmem" || space == "smem"; }

}  // namespace

call_estimate price_pallas_call(schema::PallasCall::Reader call, const device_rates& rates) {
  const auto& eff = rates.chip->efficiency;
  call_estimate e;
  e.name = call.getName().cStr();
  e.count = std::max(0.0, call.getCount());
  auto plan = plan_axes(call, rates);
  e.cores_used = plan.cores_used;
  e.steps_per_core = plan.steps;
  size_t n = plan.extent.size();
  if (rates.chip->megacore && rates.cores > 1 && plan.cores_used == 1)
    e.notes.push_back(fmt::format(
        "{}: no \"parallel\" grid axis with more than one step: one of the {} TensorCores idles",
        e.name, rates.cores));

  // Step work on one core.
  double matmul_us = 0;
  double peak_sum = 0;
  for (auto d : call.getStepDots()) {
    double useful = 2.0 * std::max<int64_t>(d.getBatch(), 1) * d.getM() * d.getN() * d.getK()
                    * d.getCount();
    matmul_us += rates.matmul_us(d, eff.mxu) * d.getCount();
    e.matmul_flops += useful;
    peak_sum += useful * rates.matmul_core(d.getLhsDtype().cStr(), d.getRhsDtype().cStr());
  }
  double vpu_flops = call.getStepVpuFlops();
  if (call.getStepDots().size() == 0 && vpu_flops == 0)
    vpu_flops = call.getStepFlops();  // a structure without the split: all on the VPU
  double vpu_us = vpu_flops / (rates.vpu_core * eff.vpu) * 1e6;
  double eup_us = call.getStepTranscendentals() / (rates.eup_core * eff.vpu) * 1e6;
  double step_compute = rates.overlapped(matmul_us, vpu_us, eup_us);
  double step_overhead = eff.step_overhead_us;
  double step = step_compute + step_overhead;
  for (auto p : call.getUnknownPrimitives())
    e.unmodeled.push_back(fmt::format("{}: primitive {} in the kernel body is not priced",
                                      e.name, p.cStr()));

  // Block copies per core, per transition kind.
  double bw = rates.hbm * eff.hbm / plan.cores_used * 1e-6;  // bytes per microsecond per core
  std::vector<double> moved(n, 0.0);
  double first_in = 0, last_out = 0, core_bytes = 0;
  e.vmem_limit = call.getVmemLimitBytes() > 0 ? static_cast<double>(call.getVmemLimitBytes())
                                              : static_cast<double>(rates.chip->scoped_vmem_bytes);
  for (auto op : call.getOperands()) {
    auto type = op.getType();
    std::string_view space = op.getMemorySpace().cStr();
    operand_estimate t;
    t.index = op.getIndex();
    if (op.getRole() == schema::OperandRole::SCALAR_PREFETCH) {
      t.role = "scalarPrefetch";
      t.copies = 1;
      t.bytes = static_cast<double>(op.getBlockBytes());
      first_in += t.bytes;
      core_bytes += t.bytes;
      e.traffic.push_back(t);
      continue;
    }
    bool input = op.getRole() == schema::OperandRole::INPUT;
    t.role = input ? "input" : "output";
    if (!pipelined(space)) {  // left in HBM: the kernel copies what it needs by hand
      e.traffic.push_back(t);
      continue;
    }
    auto block = shape_of(op.getBlockShape());
    double bytes = rates.tiled_bytes(block, type.getDtype().cStr());
    unsigned buffers = op.getBuffering() == 0 ? 2 : op.getBuffering();
    if (space == "vmem")
      e.vmem_bytes += buffers * bytes;
    bool unknown = false;
    auto p = change_probability(op, plan, unknown);
    if (unknown)
      e.unmodeled.push_back(fmt::format("{}: {} {} has no index-map dependence; assumed to "
                                        "change every step", e.name, t.role, t.index));
    double copies = 1;
    for (size_t a = 0; a < n; ++a) {
      copies += plan.transitions[a] * p[a];
      moved[a] += p[a] * bytes;
    }
    (input ? first_in : last_out) += bytes;
    core_bytes += copies * bytes;
    t.copies = copies * plan.cores_used;
    t.bytes = copies * bytes * plan.cores_used;
    e.traffic.push_back(t);
  }
  for (auto s : call.getScratch()) {
    if (s.getMemorySpace() == "vmem")
      e.vmem_bytes += rates.tiled_bytes(shape_of(s.getType().getShape()),
                                        s.getType().getDtype().cStr());
  }
  if (call.getVmemLimitBytes() > 0
      && static_cast<uint64_t>(call.getVmemLimitBytes()) > rates.chip->vmem_bytes) {
    e.fits = false;
    e.notes.push_back(fmt::format(
        "{}: vmem_limit_bytes {:.1f} MiB exceeds the {:.0f} MiB of VMEM of a {} core", e.name,
        call.getVmemLimitBytes() / mib, rates.chip->vmem_bytes / mib, rates.chip->name));
  }
  if (e.vmem_bytes > e.vmem_limit)
    e.fits = false;

  // The pipeline: prologue copies, the first step, every later step as the longer of its
  // compute and the copies it waits for, then the last write-back.
  double manual = call.getStepDmaBytes();
  auto dma = [&](double bytes) { return bytes > 0 ? eff.dma_latency_us + bytes / bw : 0.0; };
  double body = step;
  for (size_t a = 0; a < n; ++a)
    body += plan.transitions[a] * std::max(step, dma(moved[a] + manual));
  double prologue = dma(first_in + manual);
  double epilogue = dma(last_out);
  double per_run = eff.kernel_launch_us + prologue + body + epilogue;
  core_bytes += manual * plan.steps;

  e.time_us = per_run * e.count;
  e.compute_us = step_compute * plan.steps * e.count;
  e.overhead_us = (step_overhead * plan.steps + eff.kernel_launch_us) * e.count;
  e.dma_us = core_bytes / bw * e.count;
  e.exposed_dma_us = std::max(0.0, e.time_us - e.compute_us - e.overhead_us);
  double all_steps = plan.steps * plan.cores_used * e.count;
  e.matmul_flops *= all_steps;
  e.flops = e.matmul_flops + vpu_flops * all_steps;
  e.matmul_peak = e.matmul_flops > 0 ? peak_sum / (e.matmul_flops / all_steps) * rates.cores
                                     : rates.bf16_core * rates.cores;
  e.hbm_bytes = core_bytes * plan.cores_used * e.count;
  for (auto& t : e.traffic) {
    t.copies *= e.count;
    t.bytes *= e.count;
  }

  // The bound is what sets the pace: fixed costs around a short grid; else the copies when
  // they outlast the steps' compute and overhead together (each step waits for the longer
  // of the two); else the larger of compute and per-step overhead.
  double fixed = (eff.kernel_launch_us + prologue + epilogue) * e.count;
  double per_step_overhead = step_overhead * plan.steps * e.count;
  if (fixed > 0.5 * e.time_us)
    e.bound = "latency";
  else if (e.dma_us >= e.compute_us + per_step_overhead)
    e.bound = "memory";
  else if (per_step_overhead > e.compute_us)
    e.bound = "overhead";
  else
    e.bound = "compute";
  return e;
}

}  // namespace maxkernel::tpu_nodes::model
