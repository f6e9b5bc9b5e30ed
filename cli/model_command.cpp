#include "cli/model_command.hpp"

#include "cli/candidate_path.hpp"
#include "cli/enum_name.hpp"
#include "cli/kernel_file.hpp"
#include "cli/node_evaluation.hpp"
#include "cli/output_file.hpp"
#include "cli/profile_report.hpp"
#include "cli/task_session.hpp"
#include "messages/version.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>

namespace maxkernel::cli {

namespace fs = std::filesystem;

int run_model(const model_options& opts) {
  auto started = std::chrono::steady_clock::now();
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  std::string error, source;
  auto kind = classify_spec(opts.spec, error);
  if (kind == spec_kind::invalid) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (!read_kernel(opts.kernel, source, error) || !output_dir_exists(opts.json, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  task_session task;
  session_flags flags{opts.chips.empty() ? "" : opts.chips.front(),
                      opts.state_dir,
                      opts.no_store,
                      opts.simulate_device_ms,
                      opts.memory_limit_bytes,
                      opts.deadline_seconds};
  if (int code = open_task_session(opts.spec, kind, flags, task))
    return code;
  auto& session = *task.session;
  auto spec = task.spec();
  std::vector<std::string> chips = opts.chips;
  if (chips.empty())
    chips.push_back(spec.getChip().cStr());

  human << fmt::format("task {}, kernel {}\n", spec.getName().cStr(), opts.kernel);
  human << fmt::format("  {:<6} {:>14} {:>14} {:>9} {:>9} {:<9} {}\n", "chip", "kernel us",
                       "reference us", "speedup", "roofline", "bound", "correct");
  nlohmann::json rows = nlohmann::json::array();
  unsigned evaluations = 0, hits = 0;
  bool all_correct = true;
  std::optional<bool> tested;  // correctness does not depend on the chip: tested once
  std::string details;
  for (const auto& chip : chips) {
    messages::request_settings settings;
    settings.chip = chip;
    settings.profile_only = tested.has_value();
    auto kernel = evaluate(session, spec, source, fs::absolute(opts.kernel).string(), settings);
    if (kernel.exit_code != 0) {
      std::cerr << "error: " << chip << ": " << kernel.error << "\n";
      return kernel.exit_code;
    }
    settings.reference = true;
    auto reference = evaluate(session, spec, "", "reference", settings);
    auto k = kernel.result();
    evaluations += 1;
    hits += k.getCached() ? 1 : 0;
    // A kernel refused on this chip (VMEM OOM) was never tested: the next chip tests it.
    bool correct = tested.value_or(k.getCorrect());
    bool lowered = k.getHasProfile();
    if (!tested && lowered)
      tested = k.getCorrect();
    if (!lowered)
      correct = false;
    all_correct = all_correct && correct;
    double kernel_us = k.getHasProfile() ? k.getProfile().getTimeUs() : 0;
    double reference_us = 0;
    if (reference.exit_code == 0) {
      evaluations += 1;
      hits += reference.result().getCached() ? 1 : 0;
      if (reference.result().getHasProfile())
        reference_us = reference.result().getProfile().getTimeUs();
    }
    auto num = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    nlohmann::json row{{"chip", chip},
                       {"correct", correct},
                       {"kernel_time_us", num(kernel_us)},
                       {"reference_time_us", num(reference_us)},
                       {"speedup_vs_reference",
                        kernel_us > 0 && reference_us > 0 ? nlohmann::json(reference_us / kernel_us)
                                                          : nlohmann::json(nullptr)},
                       {"timing", k.getHasProfile() ? nlohmann::json(timing_name(k.getProfile()))
                                                    : nlohmann::json(nullptr)},
                       {"profile", k.getHasProfile() ? profile_json(k.getProfile())
                                                     : nlohmann::json(nullptr)}};
    // why there is no time, about the user's file (not the worker's copy of it)
    std::string error = k.getHasProfile() ? "" : with_kernel_path(failure_of(k), opts.kernel);
    if (!k.getHasProfile())
      row["error"] = error;
    rows.push_back(row);
    if (k.getHasProfile()) {
      auto p = k.getProfile();
      human << fmt::format("  {:<6} {:>14.2f} {:>14.2f} {:>8.2f}x {:>8.1f}% {:<9} {}\n", chip,
                           kernel_us, reference_us,
                           reference_us > 0 ? reference_us / kernel_us : 0.0,
                           100 * p.getRooflineUs() / kernel_us, p.getBound().cStr(),
                           correct ? "yes" : "NO");
      details += fmt::format("  {}:\n", chip) + profile_summary(p, "    ");
    } else {
      // the table says which phase failed; the message (a traceback's last line, often
      // long) goes below it whole
      std::string phase = "no profile";
      if (auto p = failed_phase(k))
        phase = fmt::format("{} failed [{}]", enum_name(p->getPhase()),
                            enum_name(p->getErrorClass()));
      human << fmt::format("  {:<6} {:>14} {:>14} {:>9} {:>9} {:<9} {}\n", chip, "-", "-", "-",
                           "-", "-", phase);
      details += fmt::format("  {}: {}: {}\n", chip, phase, error);
    }
  }
  human << details << fmt::format("all times modeled unless marked measured ({} of {} answered "
                                  "from the evaluation store)\n",
                                  hits, evaluations);
  if (!opts.json.empty()) {
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    nlohmann::json j{{"schema", 1},
                     {"command", "model"},
                     {"task", spec.getName().cStr()},
                     {"kernel", opts.kernel},
                     {"backend", session.backend()},
                     {"chips", rows},
                     {"evaluations", evaluations},
                     {"cache_hits", hits},
                     {"wall_seconds", wall},
                     {"jax_version", session.jax_version()},
                     {"maxkernel_version", messages::maxkernel_version()}};
    if (!write_output(opts.json, j.dump(2) + "\n", error)) {
      std::cerr << "error: " << error << "\n";
      return 3;
    }
  }
  return all_correct ? 0 : 1;
}

}  // namespace maxkernel::cli
