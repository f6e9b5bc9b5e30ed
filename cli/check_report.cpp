#include "cli/check_report.hpp"

#include "cli/candidate_path.hpp"
#include "cli/enum_name.hpp"
#include "cli/profile_report.hpp"
#include "messages/version.hpp"

#include <fmt/format.h>

#include <map>

namespace maxkernel::cli {

namespace {

nlohmann::json nullable(double v) {
  return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// A message as the user reads it: about their kernel file, not the worker's copy of it.
std::string user_message(capnp::Text::Reader message, const check_context& ctx) {
  return ctx.reference_only ? std::string(message.cStr())
                            : with_kernel_path(message.cStr(), ctx.kernel_path);
}

nlohmann::json diagnosis_json(schema::Diagnosis::Reader d) {
  nlohmann::json suggestions = nlohmann::json::array();
  for (auto s : d.getSuggestions())
    suggestions.push_back({{"kind", enum_name(s.getKind())},
                           {"call", s.getCallIndex()},
                           {"operand_role", s.getOperandRole().cStr()},
                           {"operand_index", s.getOperandIndex()},
                           {"axis", s.getAxis()},
                           {"factor", s.getFactor()},
                           {"rationale", s.getRationale().cStr()}});
  return {{"bound", d.getBound().cStr()},
          {"bottleneck_call", d.getBottleneckCallName().cStr()},
          {"headroom", d.getHeadroom()},
          {"headroom_us", d.getHeadroomUs()},
          {"suggestions", suggestions}};
}

}  // namespace

nlohmann::json check_json(schema::KernelSpec::Reader spec, schema::EvalResult::Reader result,
                          const check_context& ctx) {
  using nlohmann::json;
  json phases = json::array();
  std::map<std::string, int> failures;
  for (auto p : result.getPhases()) {
    phases.push_back({{"phase", enum_name(p.getPhase())},
                      {"status", enum_name(p.getStatus())},
                      {"error_class", enum_name(p.getErrorClass())},
                      {"message", user_message(p.getMessage(), ctx)},
                      {"seconds", p.getSeconds()}});
    if (p.getStatus() == schema::Status::FAILED)
      ++failures[enum_name(p.getErrorClass())];
  }
  json cases = json::array();
  for (auto c : result.getTest().getCases()) {
    json worst = json::array();
    for (auto i : c.getWorstIndex())
      worst.push_back(i);
    cases.push_back({{"configuration", c.getConfiguration()},
                     {"seed", c.getSeed()},
                     {"kind", c.getKind().cStr()},
                     {"reduced", c.getReduced()},
                     {"input_shapes", c.getInputShapes().cStr()},
                     {"passed", c.getPassed()},
                     {"output", c.getOutput()},
                     {"max_abs_err", c.getMaxAbsErr()},
                     {"max_rel_err", c.getMaxRelErr()},
                     {"worst_index", worst},
                     {"message", user_message(c.getMessage(), ctx)}});
  }
  json notes = json::array();
  for (auto n : result.getTest().getNotes())
    notes.push_back(n.cStr());
  json calls = json::array();
  if (result.getHasStructure()) {
    for (auto call : result.getStructure().getPallasCalls()) {
      json grid = json::array(), blocks = json::array();
      for (auto g : call.getGrid())
        grid.push_back(g);
      for (auto op : call.getOperands()) {
        json shape = json::array();
        for (auto b : op.getBlockShape())
          shape.push_back(b);
        blocks.push_back({{"role", enum_name(op.getRole())}, {"block_shape", shape},
                          {"memory_space", op.getMemorySpace().cStr()}});
      }
      calls.push_back({{"name", call.getName().cStr()}, {"grid", grid}, {"operands", blocks}});
    }
  }
  bool timed = result.getHasProfile();
  double time_us = timed ? result.getProfile().getTimeUs() : 0;
  double reference_us = ctx.reference ? ctx.reference->getTimeUs() : 0;
  json speedup = timed && reference_us > 0 && time_us > 0 && !ctx.reference_only
                   ? json(reference_us / time_us)
                   : json(nullptr);
  double roofline = timed ? result.getProfile().getRooflineUs() : 0;
  return json{
    {"schema", 1},
    {"command", "check"},
    {"task", spec.getName().cStr()},
    {"spec_format", enum_name(spec.getFormat())},
    {"kernel", ctx.kernel_path},
    {"mode", ctx.reference_only ? "reference" : "check"},
    {"chip", timed ? result.getProfile().getChip().cStr() : spec.getChip().cStr()},
    {"backend", ctx.backend},
    {"timing", timed ? json(timing_name(result.getProfile())) : json(nullptr)},
    {"correct", result.getCorrect()},
    {"fallback_to_reference", false},
    {"kernel_time_us", ctx.reference_only ? json(nullptr) : nullable(time_us)},
    {"reference_time_us", nullable(reference_us)},
    {"reference_error", ctx.reference_error.empty() ? json(nullptr) : json(ctx.reference_error)},
    {"baseline_time_us", nullptr},
    {"speedup_vs_reference", speedup},
    {"speedup_vs_baseline", nullptr},
    {"roofline_time_us", nullable(roofline)},
    {"roofline_fraction", roofline > 0 && time_us > 0 ? json(roofline / time_us) : json(nullptr)},
    {"profile", timed ? profile_json(result.getProfile()) : json(nullptr)},
    {"reference_profile", ctx.reference && !ctx.reference_only ? profile_json(*ctx.reference)
                                                               : json(nullptr)},
    {"diagnosis", ctx.diagnosis ? diagnosis_json(*ctx.diagnosis) : json(nullptr)},
    {"evaluations", ctx.evaluations},
    {"cache_hits", ctx.cache_hits},
    {"failures", failures},
    {"wall_seconds", ctx.wall_seconds},
    {"tokens", {{"prompt", 0}, {"completion", 0}}},
    {"cost_usd", nullptr},
    {"seed", ctx.seed},
    {"jax_version", ctx.jax_version},
    {"maxkernel_version", messages::maxkernel_version()},
    {"phases", phases},
    {"test", {{"cases", cases},
              {"degenerate_reference", result.getTest().getDegenerateReference()},
              {"notes", notes}}},
    {"pallas_calls", calls},
    {"sandbox", ctx.sandbox},
  };
}

std::string check_summary(schema::KernelSpec::Reader spec, schema::EvalResult::Reader result,
                          const check_context& ctx) {
  std::string out = fmt::format("task {} ({}), chip {}, kernel {}\n", spec.getName().cStr(),
                                enum_name(spec.getFormat()), spec.getChip().cStr(),
                                ctx.kernel_path);
  for (auto p : result.getPhases()) {
    auto status = enum_name(p.getStatus());
    out += fmt::format("  {:<8} {:<8} {:>7.2f} s", enum_name(p.getPhase()), status, p.getSeconds());
    if (p.getStatus() == schema::Status::FAILED)
      out += fmt::format("  [{}]", enum_name(p.getErrorClass()));
    out += "\n";
    std::string msg = user_message(p.getMessage(), ctx);
    if (!msg.empty() && p.getStatus() != schema::Status::OK) {
      if (msg.size() > 1500)
        msg = msg.substr(0, 1500) + " ...";
      out += "           " + msg + "\n";
    }
  }
  if (result.getHasStructure()) {
    for (auto call : result.getStructure().getPallasCalls()) {
      std::string grid;
      for (auto g : call.getGrid())
        grid += (grid.empty() ? "" : "x") + std::to_string(g);
      out += fmt::format("  pallas_call {}: grid ({})", call.getName().cStr(), grid);
      for (auto op : call.getOperands()) {
        std::string block;
        for (auto b : op.getBlockShape())
          block += (block.empty() ? "" : ",") + (b < 0 ? std::string("None") : std::to_string(b));
        out += fmt::format(" {}[{}]", enum_name(op.getRole()).substr(0, 3), block);
      }
      out += "\n";
    }
  }
  for (auto c : result.getTest().getCases()) {
    out += fmt::format("  test cfg {} seed {} {}{}: {}  max abs {:.3g}  max rel {:.3g}  ({})\n",
                       c.getConfiguration(), c.getSeed(), c.getKind().cStr(),
                       c.getReduced() ? " reduced" : "", c.getPassed() ? "pass" : "FAIL",
                       c.getMaxAbsErr(), c.getMaxRelErr(), c.getInputShapes().cStr());
    std::string msg = user_message(c.getMessage(), ctx);
    if (!c.getPassed() && !msg.empty())
      out += "           " + msg + "\n";
  }
  for (auto n : result.getTest().getNotes())
    out += fmt::format("  note: {}\n", n.cStr());
  if (result.getHasProfile()) {
    auto p = result.getProfile();
    out += ctx.reference_only ? "  reference (XLA):\n" : "  kernel:\n";
    out += profile_summary(p, "    ");
    if (ctx.reference && !ctx.reference_only && p.getTimeUs() > 0)
      out += fmt::format("  reference (XLA) {:.2f} us ({}): speedup {:.2f}x\n",
                         ctx.reference->getTimeUs(), timing_name(*ctx.reference),
                         ctx.reference->getTimeUs() / p.getTimeUs());
  } else {
    out += "  time: not available (the kernel did not lower)\n";
  }
  if (ctx.diagnosis)
    for (auto sug : ctx.diagnosis->getSuggestions())
      out += fmt::format("  diagnosis ({}): {}\n", enum_name(sug.getKind()),
                         sug.getRationale().cStr());
  if (!ctx.reference_error.empty())
    out += "  reference time: not available: " + ctx.reference_error + "\n";
  if (ctx.cache_hits > 0)
    out += fmt::format("  {} of {} evaluations answered from the evaluation store\n",
                       ctx.cache_hits, ctx.evaluations);
  if (ctx.reference_only)
    out += fmt::format("{}  ({:.1f} s)\n", result.getHasProfile() ? "REFERENCE TIMED" : "NO TIME",
                       ctx.wall_seconds);
  else
    out += fmt::format("{}  ({:.1f} s)\n", result.getCorrect() ? "CORRECT" : "NOT CORRECT",
                       ctx.wall_seconds);
  return out;
}

}  // namespace maxkernel::cli
