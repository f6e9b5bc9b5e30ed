#include "agents/llm/prompt_sections.hpp"

#include <capnp/schema.h>
#include <fmt/format.h>

#include <algorithm>
#include <string_view>

namespace maxkernel::agents::llm {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr unsigned max_nodes = 80;          // analyze nodes shown
constexpr unsigned max_history_lines = 30;  // history entries shown
constexpr size_t max_message = 1500;        // characters of one error message

template <class E>
std::string enum_name(E value) {
  auto enumerants = capnp::Schema::from<E>().getEnumerants();
  auto i = static_cast<unsigned>(value);
  return i < enumerants.size() ? std::string(enumerants[i].getProto().getName().cStr())
                               : std::to_string(i);
}

std::string clip(std::string_view s, size_t limit) {
  if (s.size() <= limit)
    return std::string(s);
  return std::string(s.substr(0, limit)) + fmt::format(" ... [{} more characters]",
                                                       s.size() - limit);
}

std::string one_line(std::string_view s, size_t limit) {
  std::string out;
  for (char c : s)
    out += (c == '\n' || c == '\r') ? ' ' : c;
  return clip(out, limit);
}

std::string shape_of(capnp::List<int64_t>::Reader shape) {
  std::string s = "(";
  for (unsigned i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1)
    s += ",";
  return s + ")";
}

std::string tensor(schema::TensorType::Reader t) {
  return shape_of(t.getShape()) + " " + t.getDtype().cStr();
}

std::string bytes(double b) {
  if (b >= 1024.0 * kMiB)
    return fmt::format("{:.2f} GiB", b / (1024.0 * kMiB));
  if (b >= kMiB)
    return fmt::format("{:.2f} MiB", b / kMiB);
  if (b >= 1024.0)
    return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

std::string number(double v) { return fmt::format("{:.4g}", v); }

std::string short_id(const std::string& id) { return id.substr(0, 12); }

}  // namespace

std::string render_chip(const config::chip& c) {
  std::string s;
  s += fmt::format("- chip: {} ({} device{} per chip, {} TensorCore{} per device{})\n", c.name,
                   c.devices_per_chip, c.devices_per_chip == 1 ? "" : "s", c.cores_per_device,
                   c.cores_per_device == 1 ? "" : "s",
                   c.megacore ? ", megacore: \"parallel\" grid axes split across the cores"
                              : "");
  s += fmt::format("- MXU: {} per core, {}x{}; pad matmul dims to multiples of {}\n",
                   c.mxus_per_core, c.mxu_size, c.mxu_size, c.mxu_size);
  s += fmt::format("- peak: {} bf16 FLOP/s", number(c.bf16_flops));
  if (c.int8_ops > 0)
    s += fmt::format(", {} int8 OP/s", number(c.int8_ops));
  if (c.fp8_flops > 0)
    s += fmt::format(", {} fp8 FLOP/s", number(c.fp8_flops));
  s += fmt::format(", {} f32 VPU FLOP/s per chip\n", number(c.vpu_flops));
  s += fmt::format("- HBM: {} at {} GB/s; roofline crossover {:.0f} FLOP/byte\n",
                   bytes(static_cast<double>(c.hbm_bytes)), number(c.hbm_bandwidth / 1e9),
                   c.hbm_bandwidth > 0 ? c.bf16_flops / c.hbm_bandwidth : 0.0);
  s += fmt::format("- VMEM per core: {}; default scoped VMEM limit {} (raise it with "
                   "pltpu.CompilerParams(vmem_limit_bytes=...), at most the core's VMEM)\n",
                   bytes(static_cast<double>(c.vmem_bytes)),
                   bytes(static_cast<double>(c.scoped_vmem_bytes)));
  s += fmt::format("- SMEM per core: {}\n", bytes(static_cast<double>(c.smem_bytes)));
  s += fmt::format("- vreg: {} sublanes x {} lanes of 32 bits; {}\n", c.sublanes, c.lanes,
                   c.packed_sublane_tiling
                       ? "packed dtypes tile as (16,128) for 16-bit and (32,128) for 8-bit"
                       : "the last two block dims tile as (8,128)");
  return s;
}

std::string render_spec(schema::KernelSpec::Reader spec) {
  std::string s;
  s += fmt::format("Task: {}\n", spec.getName().cStr());
  if (spec.getDescription().size())
    s += fmt::format("Description: {}\n", one_line(spec.getDescription().cStr(), 600));
  s += fmt::format("Reference function: `{}` (the kernel's `workload` takes the same arguments "
                   "in the same order and returns the same outputs)\n",
                   spec.getReferenceEntry().cStr());
  auto configs = spec.getConfigurations();
  for (unsigned i = 0; i < configs.size(); ++i) {
    auto cfg = configs[i];
    s += fmt::format("Configuration {}{}:\n", i,
                     cfg.getName().size() ? fmt::format(" ({})", cfg.getName().cStr()) : "");
    for (auto in : cfg.getInputs()) {
      if (in.getIsStatic())
        s += fmt::format("  - input {}: static Python value {}\n", in.getName().cStr(),
                         in.getStaticValue().cStr());
      else
        s += fmt::format("  - input {}: {}{}\n", in.getName().cStr(), tensor(in.getType()),
                         in.getStructural() ? " (integer structure: indices, offsets or sizes)"
                                            : "");
    }
    auto outs = cfg.getOutputs();
    for (unsigned o = 0; o < outs.size(); ++o)
      s += fmt::format("  - output {}: {}\n", o, tensor(outs[o]));
  }
  if (spec.getDims().size()) {
    s += "Named dims:";
    for (auto d : spec.getDims())
      s += fmt::format(" {}={}", d.getName().cStr(), d.getSize());
    s += "\n";
  }
  if (spec.getTolerances().size()) {
    s += "Tolerances:";
    for (auto t : spec.getTolerances())
      s += fmt::format(" [{}] atol {} rtol {};",
                       t.getOutput() < 0 ? std::string("all outputs")
                                         : fmt::format("output {}", t.getOutput()),
                       t.getAtol(), t.getRtol());
    s += "\n";
  }
  if (spec.getFlops() > 0)
    s += fmt::format("FLOPs (task's count): {}\n", number(spec.getFlops()));
  s += "Correctness is tested at reduced sizes as well as the full ones, so the kernel must "
       "derive every size from its inputs' shapes.\n";
  s += "\nReference module:\n```python\n";
  std::string ref = spec.getReference().cStr();
  s += ref;
  if (!ref.empty() && ref.back() != '\n')
    s += "\n";
  s += "```\n";
  return s;
}

std::string render_analysis(schema::DataflowGraph::Reader g) {
  std::string s;
  s += fmt::format("FLOPs {}, transcendentals {}, bytes touched by all ops {}, bytes of graph "
                   "inputs and outputs {} (the traffic of a perfectly fused kernel)\n",
                   number(g.getFlops()), number(g.getTranscendentals()), bytes(g.getBytes()),
                   bytes(g.getMinBytes()));
  auto ins = g.getInputs();
  for (unsigned i = 0; i < ins.size(); ++i)
    s += fmt::format("in{}: {}\n", i, tensor(ins[i]));
  auto nodes = g.getNodes();
  unsigned shown = std::min<unsigned>(nodes.size(), max_nodes);
  for (unsigned i = 0; i < shown; ++i) {
    auto n = nodes[i];
    std::string operands;
    auto ids = n.getOperandIds();
    auto inputs = n.getOperandInputs();
    auto literals = n.getOperandLiterals();
    auto types = n.getOperands();
    for (unsigned k = 0; k < types.size(); ++k) {
      std::string name;
      if (k < literals.size() && literals[k].size())
        name = one_line(literals[k].cStr(), 40);
      else if (k < inputs.size() && inputs[k] >= 0)
        name = fmt::format("in{}", inputs[k]);
      else if (k < ids.size() && ids[k] >= 0)
        name = fmt::format("n{}", ids[k]);
      else
        name = "const";
      operands += (k ? ", " : "") + name + ":" + tensor(types[k]);
    }
    std::string results;
    for (auto r : n.getResults())
      results += (results.empty() ? "" : ", ") + tensor(r);
    std::string params = n.getParams().cStr();
    s += fmt::format("n{} = {}({}) -> {}{}{}\n", n.getId(), n.getPrimitive().cStr(), operands,
                     results, params.empty() || params == "{}" ? "" : " " + one_line(params, 160),
                     n.getCount() != 1 ? fmt::format(" x{}", number(n.getCount())) : "");
  }
  if (nodes.size() > shown)
    s += fmt::format("... {} more nodes\n", nodes.size() - shown);
  auto out_ids = g.getOutputIds();
  auto out_inputs = g.getOutputInputs();
  auto outs = g.getOutputs();
  for (unsigned o = 0; o < outs.size(); ++o) {
    std::string from = o < out_ids.size() && out_ids[o] >= 0 ? fmt::format("n{}", out_ids[o])
                       : o < out_inputs.size() && out_inputs[o] >= 0
                           ? fmt::format("in{}", out_inputs[o])
                           : std::string("?");
    s += fmt::format("out{} = {}: {}\n", o, from, tensor(outs[o]));
  }
  return s;
}

int best_entry(capnp::List<schema::HistoryEntry>::Reader history) {
  int best = -1;
  double best_time = 0;
  for (unsigned i = 0; i < history.size(); ++i) {
    auto r = history[i].getResult();
    if (!r.getCorrect() || !r.getHasProfile())
      continue;
    double t = r.getProfile().getTimeUs();
    if (best < 0 || t <= best_time) {
      best = static_cast<int>(i);
      best_time = t;
    }
  }
  if (best < 0 && history.size() > 0)
    best = static_cast<int>(history.size()) - 1;
  return best;
}

std::string render_history(capnp::List<schema::HistoryEntry>::Reader history) {
  if (history.size() == 0)
    return "(empty: no candidate has been written yet)\n";
  std::string s;
  unsigned first = history.size() > max_history_lines ? history.size() - max_history_lines : 0;
  if (first > 0)
    s += fmt::format("({} older candidates not shown)\n", first);
  for (unsigned i = first; i < history.size(); ++i) {
    auto e = history[i];
    auto c = e.getCandidate();
    auto r = e.getResult();
    std::string line = fmt::format("- id {} ", c.getId().cStr());
    line += c.getParentId().size() ? fmt::format("from {} by {}", short_id(c.getParentId().cStr()),
                                                 c.getStrategy().cStr())
                                   : fmt::format("(first kernel, {})", c.getOrigin().cStr());
    line += ": ";
    std::string failed;
    for (auto p : r.getPhases())
      if (p.getStatus() == schema::Status::FAILED) {
        failed = fmt::format("FAILED at {} ({}): {}", enum_name(p.getPhase()),
                             enum_name(p.getErrorClass()), one_line(p.getMessage().cStr(), 160));
        break;
      }
    if (!failed.empty())
      line += failed;
    else
      line += r.getCorrect() ? "correct" : "NOT correct (outputs differ)";
    if (r.getHasProfile()) {
      auto p = r.getProfile();
      line += fmt::format(", {:.2f} us {}", p.getTimeUs(), enum_name(p.getTiming()));
      if (p.getTimeUs() > 0 && p.getRooflineUs() > 0)
        line += fmt::format(" ({:.0f}% of roofline {:.2f} us, {}-bound)",
                            100.0 * p.getRooflineUs() / p.getTimeUs(), p.getRooflineUs(),
                            p.getBound().cStr());
    }
    if (e.getHasDiagnosis() && e.getDiagnosis().getSuggestions().size())
      line += "; diagnosis: " +
              one_line(e.getDiagnosis().getSuggestions()[0].getRationale().cStr(), 240);
    s += line + "\n";
  }
  return s;
}

std::string render_structure(schema::KernelStructure::Reader st) {
  std::string s;
  auto calls = st.getPallasCalls();
  for (unsigned i = 0; i < calls.size(); ++i) {
    auto c = calls[i];
    std::string grid;
    for (auto g : c.getGrid())
      grid += (grid.empty() ? "" : ", ") + std::to_string(g);
    std::string sem;
    for (auto d : c.getDimensionSemantics())
      sem += (sem.empty() ? "" : ", ") + std::string(d.cStr());
    s += fmt::format("pallas_call {} `{}`: grid ({}), dimension_semantics [{}]{}{}\n", i,
                     c.getName().cStr(), grid, sem.empty() ? "default" : sem,
                     c.getNumScalarPrefetch()
                         ? fmt::format(", {} scalar-prefetch operands", c.getNumScalarPrefetch())
                         : "",
                     c.getVmemLimitBytes()
                         ? fmt::format(", vmem_limit_bytes {}",
                                       bytes(static_cast<double>(c.getVmemLimitBytes())))
                         : "");
    for (auto o : c.getOperands()) {
      std::string block;
      for (auto b : o.getBlockShape())
        block += (block.empty() ? "" : ", ") + (b < 0 ? std::string("None") : std::to_string(b));
      s += fmt::format("  {} {}: array {}, block ({}) in {}, {} buffer{}, {} per block\n",
                       enum_name(o.getRole()), o.getIndex(), tensor(o.getType()), block,
                       o.getMemorySpace().cStr(), o.getBuffering(),
                       o.getBuffering() == 1 ? "" : "s",
                       bytes(static_cast<double>(o.getBlockBytes())));
    }
    for (auto sc : c.getScratch())
      s += fmt::format("  scratch: {} in {} ({})\n", tensor(sc.getType()),
                       sc.getMemorySpace().cStr(), bytes(static_cast<double>(sc.getBytes())));
  }
  if (calls.size() == 0)
    s += "(no pallas_call found in the kernel)\n";
  return s;
}

std::string render_profile(schema::Profile::Reader p) {
  std::string s;
  s += fmt::format("{} on {} ({} backend): {:.2f} us; roofline {:.2f} us", enum_name(p.getTiming()),
                   p.getChip().cStr(), p.getBackend().cStr(), p.getTimeUs(), p.getRooflineUs());
  if (p.getTimeUs() > 0)
    s += fmt::format(" ({:.0f}% of roofline)", 100.0 * p.getRooflineUs() / p.getTimeUs());
  s += fmt::format("; {}-bound\n", p.getBound().cStr());
  s += fmt::format("compute {:.2f} us, DMA {:.2f} us ({:.2f} us exposed), per-step overhead "
                   "{:.2f} us, outside the pallas_calls {:.2f} us\n",
                   p.getComputeUs(), p.getDmaUs(), p.getExposedDmaUs(), p.getOverheadUs(),
                   p.getOutsideUs());
  s += fmt::format("MXU utilization {:.0f}%, HBM {} at {} GB/s, arithmetic intensity {:.1f} "
                   "FLOP/byte, VMEM peak {} of limit {}\n",
                   100.0 * p.getMxuUtilization(), bytes(p.getHbmBytes()),
                   number(p.getHbmBandwidth() / 1e9), p.getArithmeticIntensity(),
                   bytes(static_cast<double>(p.getVmemPeakBytes())),
                   bytes(static_cast<double>(p.getVmemLimitBytes())));
  for (auto c : p.getCalls()) {
    s += fmt::format("- {}: {:.2f} us ({}-bound; compute {:.2f}, memory {:.2f}, overhead {:.2f}), "
                     "{} steps on {} core{}, VMEM {}\n",
                     c.getName().cStr(), c.getTimeUs(), c.getBound().cStr(), c.getComputeUs(),
                     c.getMemoryUs(), c.getOverheadUs(), number(c.getSteps()), c.getCoresUsed(),
                     c.getCoresUsed() == 1 ? "" : "s",
                     bytes(static_cast<double>(c.getVmemBytes())));
    for (auto t : c.getTraffic())
      s += fmt::format("    {} {}: {} copies, {}\n", t.getRole().cStr(), t.getIndex(),
                       number(t.getCopies()), bytes(t.getBytes()));
  }
  for (auto n : p.getNotes())
    s += fmt::format("note: {}\n", one_line(n.cStr(), 300));
  for (auto n : p.getUnmodeled())
    s += fmt::format("not modeled: {}\n", one_line(n.cStr(), 300));
  return s;
}

std::string render_diagnosis(schema::Diagnosis::Reader d) {
  std::string s = fmt::format("{}-bound, {:.2f} us against a roofline of {:.2f} us (headroom "
                              "{:.2f} us)",
                              d.getBound().cStr(), d.getTimeUs(), d.getRooflineUs(),
                              d.getHeadroomUs());
  if (d.getBottleneckCall() >= 0)
    s += fmt::format("; bottleneck: pallas_call {} `{}`", d.getBottleneckCall(),
                     d.getBottleneckCallName().cStr());
  s += "\nSuggestions (most promising first):\n";
  for (auto g : d.getSuggestions())
    s += fmt::format("- {}: {}\n", enum_name(g.getKind()), one_line(g.getRationale().cStr(), 400));
  return s;
}

std::string render_params(capnp::List<schema::Param>::Reader params) {
  std::string s;
  for (auto p : params)
    s += fmt::format("{}{} = {}", s.empty() ? "" : ", ", p.getName().cStr(), p.getValue().cStr());
  return s.empty() ? "(none)" : s;
}

std::string render_step(schema::PlanStep::Reader step) {
  std::string s;
  s += fmt::format("Move: {}\n", step.getMove().cStr());
  if (step.getTemplate().size())
    s += fmt::format("Template family: {}\n", step.getTemplate().cStr());
  if (step.getChanges().size())
    s += fmt::format("Parameter changes: {}\n", render_params(step.getChanges()));
  if (step.getRationale().size())
    s += fmt::format("Rationale: {}\n", step.getRationale().cStr());
  if (step.getExpectedEffect().size())
    s += fmt::format("Expected effect: {}\n", step.getExpectedEffect().cStr());
  if (step.getInstructions().size())
    s += fmt::format("Instructions: {}\n", step.getInstructions().cStr());
  return s;
}

std::string render_failure(schema::EvalResult::Reader r) {
  std::string s;
  for (auto p : r.getPhases()) {
    if (p.getStatus() != schema::Status::FAILED)
      continue;
    s += fmt::format("Phase {} failed ({}):\n{}\n", enum_name(p.getPhase()),
                     enum_name(p.getErrorClass()), clip(p.getMessage().cStr(), max_message));
  }
  auto cases = r.getTest().getCases();
  unsigned shown = 0;
  for (auto c : cases) {
    if (c.getPassed() || shown >= 4)
      continue;
    ++shown;
    s += fmt::format("Test case failed: configuration {}, seed {}, {} inputs{}, shapes {}: "
                     "output {} max abs error {}, max rel error {}{}\n",
                     c.getConfiguration(), c.getSeed(), c.getKind().cStr(),
                     c.getReduced() ? " (reduced sizes)" : "", c.getInputShapes().cStr(),
                     c.getOutput(), number(c.getMaxAbsErr()), number(c.getMaxRelErr()),
                     c.getMessage().size() ? "; " + one_line(c.getMessage().cStr(), 400) : "");
  }
  for (auto n : r.getTest().getNotes())
    s += fmt::format("Note: {}\n", one_line(n.cStr(), 300));
  if (s.empty())
    s = r.getCorrect() ? "(no failure recorded)\n"
                       : "The kernel is not correct, but no phase recorded an error message.\n";
  return s;
}

}  // namespace maxkernel::agents::llm
