#include "cli/check_command.hpp"

#include "cli/check_report.hpp"
#include "cli/kernel_file.hpp"
#include "cli/output_file.hpp"
#include "cli/spec_source.hpp"
#include "config/utf8_check.hpp"
#include "messages/capnp_io.hpp"
#include "messages/content_hash.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/message.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

// Phases of a later request replace those of an earlier one with the same phase.
void merge_phases(schema::EvalResult::Builder into, schema::EvalResult::Reader from) {
  struct phase_copy {
    schema::Phase phase;
    schema::Status status;
    schema::ErrorClass error_class;
    std::string message;
    double seconds;
  };
  std::vector<phase_copy> phases;
  auto copy_of = [](schema::PhaseResult::Reader p) {
    return phase_copy{p.getPhase(), p.getStatus(), p.getErrorClass(), p.getMessage().cStr(),
                      p.getSeconds()};
  };
  for (auto p : into.asReader().getPhases())
    phases.push_back(copy_of(p));
  for (auto q : from.getPhases()) {
    auto same = std::find_if(phases.begin(), phases.end(),
                             [&](const phase_copy& p) { return p.phase == q.getPhase(); });
    if (same != phases.end())
      *same = copy_of(q);
    else
      phases.push_back(copy_of(q));
  }
  auto list = into.initPhases(phases.size());
  for (size_t i = 0; i < phases.size(); ++i) {
    list[i].setPhase(phases[i].phase);
    list[i].setStatus(phases[i].status);
    list[i].setErrorClass(phases[i].error_class);
    list[i].setMessage(phases[i].message);
    list[i].setSeconds(phases[i].seconds);
  }
}

// Whether a phase that decides correctness (load, lower, test) failed. A failed profile
// (structure extraction, timing) is reported but does not make a kernel incorrect.
bool phase_failed(schema::EvalResult::Reader r) {
  for (auto p : r.getPhases())
    if (p.getStatus() == schema::Status::FAILED && p.getPhase() != schema::Phase::PROFILE)
      return true;
  return false;
}

}  // namespace

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
  if (!opts.baseline && !read_kernel(kernel_path, source, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (!output_dir_exists(opts.json, error)) {
    std::cerr << "error: --json " << error << "\n";
    return 2;
  }

  // Native specs are validated before the worker starts: bad input never waits for JAX.
  spec_outcome spec_loaded;
  if (kind == spec_kind::native) {
    spec_loaded = load_spec(opts.spec, kind, opts.chip, opts.memory_limit_bytes, nullptr);
    if (spec_loaded.exit_code != 0) {
      std::cerr << "error: " << spec_loaded.error << "\n";
      return spec_loaded.exit_code;
    }
  }

  auto wopts = tpu_nodes::worker_options::defaults();
  wopts.memory_limit_bytes = opts.memory_limit_bytes;
  tpu_nodes::worker_client worker(wopts);
  if (!worker.start(error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  if (kind != spec_kind::native) {
    spec_loaded = load_spec(opts.spec, kind, opts.chip, opts.memory_limit_bytes, &worker);
    if (spec_loaded.exit_code != 0) {
      std::cerr << "error: " << spec_loaded.error << "\n";
      return spec_loaded.exit_code;
    }
  }
  auto spec_msg = messages::decode<schema::KernelSpec>(spec_loaded.spec_bytes, error);
  auto spec = spec_msg->root<schema::KernelSpec>();
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

  capnp::MallocMessageBuilder request_msg;
  auto request = request_msg.initRoot<schema::EvalRequest>();
  request.setSchemaVersion(schema::SCHEMA_VERSION);
  request.setSpec(spec);
  auto candidate = request.initCandidate();
  candidate.setSchemaVersion(schema::SCHEMA_VERSION);
  candidate.setId(messages::sha256_hex(source));
  candidate.setSource(source);
  candidate.setOrigin(fs::absolute(kernel_path).string());
  auto options = request.initOptions();
  options.setFull(opts.full);
  options.setChip(spec.getChip());
  auto seeds = options.initSeeds(opts.seeds.size());
  for (size_t i = 0; i < opts.seeds.size(); ++i)
    seeds.set(i, opts.seeds[i]);

  auto deadline = std::chrono::milliseconds(static_cast<int64_t>(opts.deadline_seconds * 1000));
  capnp::MallocMessageBuilder result_msg;
  auto result = result_msg.initRoot<schema::EvalResult>();
  result.setSchemaVersion(schema::SCHEMA_VERSION);
  result.setCandidateId(candidate.getId());

  // Each step answers an EvalResult; its phases are merged into one.
  auto step = [&](tpu_nodes::eval_kind step_kind, bool& request_error) {
    auto answer = worker.evaluate(step_kind, request.asReader(), deadline);
    if (!answer.ok) {
      request_error = true;
      std::cerr << "error: " << tpu_nodes::to_string(step_kind) << ": " << answer.message << "\n";
      return answer.error_class == schema::ErrorClass::BAD_INPUT
                 || answer.error_class == schema::ErrorClass::TOO_LARGE
               ? 2
               : 3;
    }
    std::string err;
    auto decoded = messages::decode<schema::EvalResult>(answer.bytes, err);
    if (!decoded) {
      request_error = true;
      std::cerr << "error: the worker sent a bad result: " << err << "\n";
      return 3;
    }
    auto r = decoded->root<schema::EvalResult>();
    merge_phases(result, r);
    if (r.getHasStructure()) {
      result.setStructure(r.getStructure());
      result.setHasStructure(true);
    }
    if (r.hasTest() && r.getTest().getCases().size() > 0)
      result.setTest(r.getTest());
    if (r.getHasProfile()) {
      result.setProfile(r.getProfile());
      result.setHasProfile(true);
    }
    if (step_kind == tpu_nodes::eval_kind::test)
      result.setCorrect(r.getCorrect());
    return 0;
  };

  bool request_error = false;
  int code = step(tpu_nodes::eval_kind::lower, request_error);
  if (request_error)
    return code;
  bool lowered = !phase_failed(result.asReader());
  if (lowered) {
    code = step(tpu_nodes::eval_kind::extract, request_error);
    if (request_error)
      return code;
  }
  if (lowered) {
    code = step(tpu_nodes::eval_kind::test, request_error);
    if (request_error)
      return code;
    if (phase_failed(result.asReader()))
      result.setCorrect(false);
  }
  if (lowered && worker.description().platform == "tpu") {
    code = step(tpu_nodes::eval_kind::time, request_error);
    if (request_error)
      return code;
  }

  check_context ctx;
  ctx.kernel_path = kernel_path;
  ctx.backend = worker.description().platform == "tpu" ? "jax-tpu" : "jax-cpu";
  ctx.jax_version = worker.description().jax_version;
  ctx.sandbox = worker.description().sandbox;
  ctx.seed = opts.seeds.empty() ? 0 : opts.seeds.front();
  ctx.wall_seconds = std::chrono::duration<double>(clock_type::now() - started).count();
  human << check_summary(spec, result.asReader(), ctx) << std::flush;
  if (!opts.json.empty()
      && !write_output(opts.json, check_json(spec, result.asReader(), ctx).dump(2) + "\n", error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return result.getCorrect() ? 0 : 1;
}

}  // namespace maxkernel::cli
