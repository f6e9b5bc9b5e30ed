#include "cli/profile_report.hpp"

#include <fmt/format.h>

namespace maxkernel::cli {

namespace {
constexpr double mib = 1024.0 * 1024.0;
}  // namespace

const char* timing_name(schema::Profile::Reader profile) {
  return profile.getTiming() == schema::Timing::MEASURED ? "measured" : "modeled";
}

nlohmann::json profile_json(schema::Profile::Reader p) {
  using nlohmann::json;
  json calls = json::array();
  for (auto c : p.getCalls()) {
    json traffic = json::array();
    for (auto t : c.getTraffic())
      traffic.push_back({{"role", t.getRole().cStr()},
                         {"index", t.getIndex()},
                         {"copies", t.getCopies()},
                         {"bytes", t.getBytes()}});
    calls.push_back({{"name", c.getName().cStr()},
                     {"time_us", c.getTimeUs()},
                     {"compute_us", c.getComputeUs()},
                     {"dma_us", c.getDmaUs()},
                     {"exposed_dma_us", c.getExposedDmaUs()},
                     {"overhead_us", c.getOverheadUs()},
                     {"flops", c.getFlops()},
                     {"hbm_bytes", c.getHbmBytes()},
                     {"vmem_bytes", c.getVmemBytes()},
                     {"mxu_utilization", c.getMxuUtilization()},
                     {"steps_per_core", c.getSteps()},
                     {"cores_used", c.getCoresUsed()},
                     {"count", c.getCount()},
                     {"bound", c.getBound().cStr()},
                     {"traffic", traffic}});
  }
  json notes = json::array(), unmodeled = json::array(), runs = json::array();
  for (auto n : p.getNotes())
    notes.push_back(n.cStr());
  for (auto n : p.getUnmodeled())
    unmodeled.push_back(n.cStr());
  for (auto r : p.getRuns())
    runs.push_back(r);
  return {{"timing", timing_name(p)},
          {"chip", p.getChip().cStr()},
          {"backend", p.getBackend().cStr()},
          {"time_us", p.getTimeUs()},
          {"roofline_us", p.getRooflineUs()},
          {"compute_us", p.getComputeUs()},
          {"dma_us", p.getDmaUs()},
          {"exposed_dma_us", p.getExposedDmaUs()},
          {"overhead_us", p.getOverheadUs()},
          {"outside_us", p.getOutsideUs()},
          {"flops", p.getFlops()},
          {"hbm_bytes", p.getHbmBytes()},
          {"mxu_utilization", p.getMxuUtilization()},
          {"hbm_bandwidth", p.getHbmBandwidth()},
          {"arithmetic_intensity", p.getArithmeticIntensity()},
          {"vmem_peak_bytes", p.getVmemPeakBytes()},
          {"vmem_limit_bytes", p.getVmemLimitBytes()},
          {"bound", p.getBound().cStr()},
          {"calls", calls},
          {"notes", notes},
          {"unmodeled", unmodeled},
          {"runs", runs}};
}

std::string profile_summary(schema::Profile::Reader p, const std::string& in) {
  std::string out = fmt::format("{}time {:.2f} us ({}, {}), roofline {:.2f} us, {}-bound\n", in,
                                p.getTimeUs(), timing_name(p), p.getChip().cStr(),
                                p.getRooflineUs(), p.getBound().cStr());
  out += fmt::format("{}  compute {:.2f} us, DMA {:.2f} us ({:.2f} exposed), overhead {:.2f} us, "
                     "outside kernels {:.2f} us\n",
                     in, p.getComputeUs(), p.getDmaUs(), p.getExposedDmaUs(), p.getOverheadUs(),
                     p.getOutsideUs());
  out += fmt::format("{}  MXU {:.1f}%, HBM {:.1f} GB/s, {:.1f} flop/byte", in,
                     100 * p.getMxuUtilization(), p.getHbmBandwidth() / 1e9,
                     p.getArithmeticIntensity());
  if (p.getVmemLimitBytes() > 0)
    out += fmt::format(", VMEM {:.2f} of {:.2f} MiB", p.getVmemPeakBytes() / mib,
                       p.getVmemLimitBytes() / mib);
  out += "\n";
  for (auto c : p.getCalls())
    out += fmt::format("{}  {}: {:.2f} us, {:.0f} steps x {} core(s), {}-bound, MXU {:.1f}%\n", in,
                       c.getName().cStr(), c.getTimeUs(), c.getSteps(), c.getCoresUsed(),
                       c.getBound().cStr(), 100 * c.getMxuUtilization());
  for (auto n : p.getNotes())
    out += fmt::format("{}  note: {}\n", in, n.cStr());
  for (auto n : p.getUnmodeled())
    out += fmt::format("{}  not modeled: {}\n", in, n.cStr());
  return out;
}

}  // namespace maxkernel::cli
