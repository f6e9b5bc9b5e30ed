#include "tpu_nodes/model/tpu_model.hpp"

#include "tpu_nodes/model/device_rates.hpp"
#include "tpu_nodes/model/pallas_call_model.hpp"
#include "tpu_nodes/model/xla_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace maxkernel::tpu_nodes::model {

namespace {

constexpr double mib = 1024.0 * 1024.0;

template <class List>
void set_texts(List list, const std::vector<std::string>& texts) {
  for (size_t i = 0; i < texts.size(); ++i)
    list.set(static_cast<unsigned>(i), texts[i]);
}

// The best a program of these flops and compulsory bytes can do on the device.
double roofline_us(double matmul_flops, double matmul_peak, double other_flops,
                   double min_bytes, const device_rates& rates) {
  double compute = (matmul_peak > 0 ? matmul_flops / matmul_peak : 0)
                   + other_flops / (rates.vpu_core * rates.cores);
  return std::max(compute, min_bytes / rates.hbm) * 1e6;
}

void write_common(schema::Profile::Builder p, const config::chip& chip) {
  p.setSchemaVersion(schema::SCHEMA_VERSION);
  p.setTiming(schema::Timing::MODELED);
  p.setChip(chip.name);
  p.setBackend("model");
}

}  // namespace

model_result price_kernel(schema::KernelStructure::Reader structure, const config::chip& chip,
                          schema::Profile::Builder profile) {
  device_rates rates(chip);
  std::vector<call_estimate> calls;
  for (auto c : structure.getPallasCalls())
    calls.push_back(price_pallas_call(c, rates));
  auto outside = price_xla_graph(structure.getOutside(), rates);

  model_result result;
  double time = outside.time_us, compute = outside.compute_us, dma = 0, exposed = 0;
  double overhead = outside.overhead_us, flops = outside.flops, bytes = outside.hbm_bytes;
  double matmul_flops = outside.matmul_flops, ideal_mxu_us = 0, vmem_peak = 0, vmem_limit = 0;
  double outside_peak = rates.bf16_core * rates.cores;
  ideal_mxu_us += outside.matmul_flops / outside_peak * 1e6;
  std::vector<std::string> notes, unmodeled = outside.unmodeled;
  const call_estimate* slowest = nullptr;
  for (const auto& c : calls) {
    time += c.time_us;
    compute += c.compute_us;
    dma += c.dma_us;
    exposed += c.exposed_dma_us;
    overhead += c.overhead_us;
    flops += c.flops;
    bytes += c.hbm_bytes;
    matmul_flops += c.matmul_flops;
    ideal_mxu_us += c.matmul_peak > 0 ? c.matmul_flops / c.matmul_peak * 1e6 : 0;
    if (c.vmem_bytes > vmem_peak) {
      vmem_peak = c.vmem_bytes;
      vmem_limit = c.vmem_limit;
    }
    notes.insert(notes.end(), c.notes.begin(), c.notes.end());
    unmodeled.insert(unmodeled.end(), c.unmodeled.begin(), c.unmodeled.end());
    if (!slowest || c.time_us > slowest->time_us)
      slowest = &c;
    if (!c.fits && result.compiles) {
      result.compiles = false;
      result.compile_error =
          c.vmem_bytes > c.vmem_limit
              ? fmt::format("VMEM OOM: needs {:.2f} MiB, limit {:.2f} MiB (pallas_call {})",
                            c.vmem_bytes / mib, c.vmem_limit / mib, c.name)
              : c.notes.back();
    }
  }
  if (calls.empty())
    notes.push_back("the kernel has no pallas_call: all of it is priced as XLA fusions");
  result.time_us = time;

  write_common(profile, chip);
  profile.setTimeUs(time);
  profile.setFlops(flops);
  profile.setHbmBytes(bytes);
  profile.setComputeUs(compute);
  profile.setDmaUs(dma);
  profile.setExposedDmaUs(exposed);
  profile.setOverheadUs(overhead);
  profile.setOutsideUs(outside.time_us);
  profile.setMxuUtilization(time > 0 ? ideal_mxu_us / time : 0);
  profile.setHbmBandwidth(time > 0 ? bytes / (time * 1e-6) : 0);
  profile.setArithmeticIntensity(bytes > 0 ? flops / bytes : 0);
  profile.setVmemPeakBytes(static_cast<int64_t>(vmem_peak));
  profile.setVmemLimitBytes(static_cast<int64_t>(vmem_limit));
  profile.setRooflineUs(roofline_us(matmul_flops, matmul_flops > 0 && ideal_mxu_us > 0
                                                      ? matmul_flops / (ideal_mxu_us * 1e-6)
                                                      : 0,
                                    flops - matmul_flops, structure.getOutside().getMinBytes(),
                                    rates));
  std::string bound = outside.bound;
  if (slowest && slowest->time_us >= outside.time_us)
    bound = slowest->bound;
  profile.setBound(bound);

  auto list = profile.initCalls(static_cast<unsigned>(calls.size()));
  for (unsigned i = 0; i < calls.size(); ++i) {
    const auto& c = calls[i];
    auto cp = list[i];
    cp.setName(c.name);
    cp.setTimeUs(c.time_us);
    cp.setComputeUs(c.compute_us);
    cp.setMemoryUs(c.dma_us);
    cp.setOverheadUs(c.overhead_us);
    cp.setFlops(c.flops);
    cp.setHbmBytes(c.hbm_bytes);
    cp.setVmemBytes(static_cast<int64_t>(c.vmem_bytes));
    cp.setBound(c.bound);
    cp.setDmaUs(c.dma_us);
    cp.setExposedDmaUs(c.exposed_dma_us);
    cp.setMxuUtilization(c.time_us > 0 && c.matmul_peak > 0
                             ? c.matmul_flops / c.matmul_peak * 1e6 / c.time_us
                             : 0);
    cp.setSteps(c.steps_per_core);
    cp.setCoresUsed(c.cores_used);
    cp.setCount(c.count);
    auto traffic = cp.initTraffic(static_cast<unsigned>(c.traffic.size()));
    for (unsigned j = 0; j < c.traffic.size(); ++j) {
      traffic[j].setRole(c.traffic[j].role);
      traffic[j].setIndex(c.traffic[j].index);
      traffic[j].setCopies(c.traffic[j].copies);
      traffic[j].setBytes(c.traffic[j].bytes);
    }
  }
  if (!result.compiles)
    notes.insert(notes.begin(), result.compile_error);
  set_texts(profile.initNotes(static_cast<unsigned>(notes.size())), notes);
  set_texts(profile.initUnmodeled(static_cast<unsigned>(unmodeled.size())), unmodeled);
  return result;
}

model_result price_xla(schema::DataflowGraph::Reader graph, const config::chip& chip,
                       schema::Profile::Builder profile) {
  device_rates rates(chip);
  auto est = price_xla_graph(graph, rates);
  model_result result;
  result.time_us = est.time_us;
  write_common(profile, chip);
  double peak = rates.bf16_core * rates.cores;
  profile.setTimeUs(est.time_us);
  profile.setFlops(est.flops);
  profile.setHbmBytes(est.hbm_bytes);
  profile.setComputeUs(est.compute_us);
  profile.setDmaUs(est.memory_us);
  profile.setExposedDmaUs(std::max(0.0, est.time_us - est.compute_us - est.overhead_us));
  profile.setOverheadUs(est.overhead_us);
  profile.setOutsideUs(est.time_us);
  profile.setMxuUtilization(est.time_us > 0 ? est.matmul_flops / peak * 1e6 / est.time_us : 0);
  profile.setHbmBandwidth(est.time_us > 0 ? est.hbm_bytes / (est.time_us * 1e-6) : 0);
  profile.setArithmeticIntensity(est.hbm_bytes > 0 ? est.flops / est.hbm_bytes : 0);
  // The program's own flops, each op once: fusions may recompute elementwise work.
  double program_flops = std::max(graph.getFlops(), est.matmul_flops);
  profile.setRooflineUs(roofline_us(est.matmul_flops, peak, program_flops - est.matmul_flops,
                                    graph.getMinBytes(), rates));
  profile.setBound(est.bound);
  std::vector<std::string> notes{fmt::format("XLA program: {} fusions", est.fusions)};
  set_texts(profile.initNotes(1), notes);
  set_texts(profile.initUnmodeled(static_cast<unsigned>(est.unmodeled.size())), est.unmodeled);
  return result;
}

}  // namespace maxkernel::tpu_nodes::model
