#include "cli/check_command.hpp"

#include "agents/diagnosis.hpp"
#include "cli/check_report.hpp"
#include "cli/node_evaluation.hpp"
#include "cli/kernel_file.hpp"
#include "cli/task_session.hpp"
#include "config/chip_loader.hpp"
#include "cli/output_file.hpp"
#include "cli/spec_source.hpp"
#include "messages/capnp_io.hpp"
#include "messages/eval_failure.hpp"

#include <capnp/message.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

int run_check(const check_options& opts) {
  auto started = clock_type::now();
  // With --json - stdout carries only the JSON.
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  std::string error;
  auto kind = classify_spec(opts.spec, error);
  if (kind == spec_kind::invalid) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  std::string kernel_path = opts.kernel;
  std::string source;
  if (!opts.baseline && !opts.reference_only && !read_kernel(kernel_path, source, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (!output_dir_exists(opts.json, error)) {
    std::cerr << "error: --json " << error << "\n";
    return 2;
  }

  task_session task;
  session_flags flags{opts.chip,       opts.state_dir,          opts.no_store,
                      opts.simulate_device_ms, opts.memory_limit_bytes, opts.deadline_seconds};
  if (int code = open_task_session(opts.spec, kind, flags, task))
    return code;
  auto& session = *task.session;
  auto spec = task.spec();
  if (opts.baseline) {
    kernel_path = spec.getBaselinePath().cStr();
    if (kernel_path.empty()) {
      std::cerr << "error: " << opts.spec << ": the spec has no baseline kernel\n";
      return 2;
    }
    if (!read_kernel(kernel_path, source, error)) {
      std::cerr << "error: " << opts.spec << ": baseline: " << error << "\n";
      return 2;
    }
  }

  messages::request_settings settings;
  settings.chip = spec.getChip().cStr();
  settings.full = opts.full;
  settings.seeds = opts.seeds;
  check_context ctx;
  evaluated candidate;
  if (!opts.reference_only) {
    candidate = evaluate(session, spec, source, fs::absolute(kernel_path).string(), settings);
    if (candidate.timed_out) {
      // The test runs the reference too: one that hangs is the spec's fault, not the kernel's.
      auto alone = settings;
      alone.reference = true;
      if (evaluate(session, spec, "", "reference", alone).timed_out) {
        std::cerr << "error: " << reference_hangs(spec, session, "when it was run") << "\n";
        return 2;
      }
      // The kernel hangs: its failure (class timeout, exit 1), reported like any other.
      std::string ignored;
      candidate.message = messages::decode<schema::EvalResult>(
        messages::timeout_result(candidate.error), ignored);
      candidate.message->allow_rereading();
      candidate.exit_code = 0;
    }
    if (candidate.exit_code != 0) {
      std::cerr << "error: " << candidate.error << "\n";
      return candidate.exit_code;
    }
    ++ctx.evaluations;
    ctx.cache_hits += candidate.result().getCached() ? 1 : 0;
  }
  // The reference is priced (or timed) like any program: XLA's, from its dataflow graph.
  settings.reference = true;
  auto reference = evaluate(session, spec, "", "reference", settings);
  if (reference.exit_code != 0) {
    if (opts.reference_only) {
      std::cerr << "error: " << reference.error << "\n";
      return reference.exit_code;
    }
    ctx.reference_error = reference.error;
  }
  std::optional<schema::Profile::Reader> reference_profile;
  if (reference.message) {
    ++ctx.evaluations;
    ctx.cache_hits += reference.result().getCached() ? 1 : 0;
    if (reference.result().getHasProfile())
      reference_profile = reference.result().getProfile();
    else
      ctx.reference_error = failure_of(reference.result());
  }

  // The profiler's reading of the kernel's profile: bound, headroom and what to change.
  capnp::MallocMessageBuilder diagnosis_msg;
  std::optional<schema::Diagnosis::Reader> diagnosis;
  if (!opts.reference_only && candidate.result().getHasProfile()) {
    auto r = candidate.result();
    config::chip chip;
    config::spec_error chip_error;
    if (config::load_chip(r.getProfile().getChip().cStr(), chip, chip_error)) {
      capnp::MallocMessageBuilder request_msg;
      auto request = request_msg.initRoot<schema::ProfilerRequest>();
      request.setSchemaVersion(schema::SCHEMA_VERSION);
      request.setProfile(r.getProfile());
      request.setHasStructure(r.getHasStructure());
      if (r.getHasStructure())
        request.setStructure(r.getStructure());
      request.setChip(chip.name);
      auto out = diagnosis_msg.initRoot<schema::Diagnosis>();
      agents::diagnose(request.asReader(), chip, out);
      diagnosis = out.asReader();
    }
  }
  ctx.diagnosis = diagnosis ? &*diagnosis : nullptr;
  ctx.kernel_path = opts.reference_only ? "reference" : kernel_path;
  ctx.reference_only = opts.reference_only;
  ctx.reference = reference_profile ? &*reference_profile : nullptr;
  ctx.backend = session.backend();
  ctx.jax_version = session.jax_version();
  ctx.seed = opts.seeds.empty() ? 0 : opts.seeds.front();
  ctx.wall_seconds = std::chrono::duration<double>(clock_type::now() - started).count();
  auto shown = opts.reference_only ? reference.result() : candidate.result();
  human << check_summary(spec, shown, ctx) << std::flush;
  if (!opts.json.empty()
      && !write_output(opts.json, check_json(spec, shown, ctx).dump(2) + "\n", error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  if (opts.reference_only)
    return reference_profile ? 0 : 3;
  return shown.getCorrect() ? 0 : 1;
}

}  // namespace maxkernel::cli
