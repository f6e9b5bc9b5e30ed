#include "tpu_nodes/evaluation_pipeline.hpp"

#include "config/chip_loader.hpp"
#include "maxkernel/schema/kernel_structure.capnp.h"
#include "maxkernel/schema/profile.capnp.h"
#include "messages/capnp_io.hpp"
#include "tpu_nodes/model/tpu_model.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/message.h>

#include <algorithm>
#include <vector>

namespace maxkernel::tpu_nodes {

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct phase_copy {
  schema::Phase phase;
  schema::Status status;
  schema::ErrorClass error_class;
  std::string message;
  double seconds;
};

std::vector<phase_copy> phases_of(schema::EvalResult::Reader r) {
  std::vector<phase_copy> out;
  for (auto p : r.getPhases())
    out.push_back({p.getPhase(), p.getStatus(), p.getErrorClass(), p.getMessage().cStr(),
                   p.getSeconds()});
  return out;
}

void write_phases(schema::EvalResult::Builder into, const std::vector<phase_copy>& phases) {
  auto list = into.initPhases(phases.size());
  for (size_t i = 0; i < phases.size(); ++i) {
    list[i].setPhase(phases[i].phase);
    list[i].setStatus(phases[i].status);
    list[i].setErrorClass(phases[i].error_class);
    list[i].setMessage(phases[i].message);
    list[i].setSeconds(phases[i].seconds);
  }
}

void set_phase(schema::EvalResult::Builder result, schema::Phase phase, schema::Status status,
               schema::ErrorClass error_class, const std::string& message, double seconds) {
  auto phases = phases_of(result.asReader());
  phase_copy entry{phase, status, error_class, message, seconds};
  auto same = std::find_if(phases.begin(), phases.end(),
                           [&](const phase_copy& p) { return p.phase == phase; });
  if (same != phases.end())
    *same = entry;
  else
    phases.push_back(entry);
  write_phases(result, phases);
}

void skip(schema::EvalResult::Builder result, schema::Phase phase, const std::string& why) {
  set_phase(result, phase, schema::Status::SKIPPED, schema::ErrorClass::NONE, why, 0);
}

pipeline_outcome failure(schema::ErrorClass error_class, std::string message) {
  pipeline_outcome out;
  out.error_class = error_class;
  out.message = std::move(message);
  return out;
}

// Phases in pipeline order (load, lower, test, profile), then a compact copy.
pipeline_outcome finish(schema::EvalResult::Builder result) {
  auto phases = phases_of(result.asReader());
  std::stable_sort(phases.begin(), phases.end(), [](const phase_copy& a, const phase_copy& b) {
    return static_cast<int>(a.phase) < static_cast<int>(b.phase);
  });
  write_phases(result, phases);
  pipeline_outcome out;
  out.ok = true;
  out.result = messages::encode_root(result.asReader());
  return out;
}

milliseconds remaining(const pipeline_settings& s) {
  return std::chrono::duration_cast<milliseconds>(s.deadline - clock_type::now());
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

std::string chip_name(schema::EvalRequest::Reader request) {
  std::string name = request.getOptions().getChip();
  if (name.empty())
    name = request.getSpec().getChip();
  return name;
}

bool load_request_chip(schema::EvalRequest::Reader request, config::chip& chip,
                       pipeline_outcome& failed) {
  auto name = chip_name(request);
  if (name.empty()) {
    failed = failure(schema::ErrorClass::BAD_INPUT,
                     "the request names no chip (options.chip and the spec's chip are empty)");
    return false;
  }
  config::spec_error error;
  if (!config::load_chip(name, chip, error)) {
    failed = failure(schema::ErrorClass::BAD_INPUT, "chip " + name + ": " + error.what());
    return false;
  }
  return true;
}

// Every figure the model writes is labelled modeled; the backend and chip say where from.
void label(schema::Profile::Builder profile, const std::string& backend, const config::chip& chip) {
  profile.setBackend(backend);
  if (profile.getChip().size() == 0)
    profile.setChip(chip.name);
  if (profile.getSchemaVersion() == 0)
    profile.setSchemaVersion(schema::SCHEMA_VERSION);
}

pipeline_outcome run_candidate(worker_client& worker, schema::EvalRequest::Reader request,
                               const pipeline_settings& s) {
  capnp::MallocMessageBuilder msg;
  auto result = msg.initRoot<schema::EvalResult>();
  result.setSchemaVersion(schema::SCHEMA_VERSION);
  result.setCandidateId(request.getCandidate().getId());
  result.setBackend(s.backend);

  pipeline_outcome failed;
  // One worker request whose phases are merged into the result; false (with `failed` set)
  // when the request itself failed.
  auto step = [&](eval_kind kind) {
    auto left = remaining(s);
    if (left <= milliseconds(0)) {
      failed = failure(schema::ErrorClass::TIMEOUT, std::string("the deadline passed before the ")
                                                      + to_string(kind) + " step");
      return false;
    }
    auto answer = worker.evaluate(kind, request, left);
    if (!answer.ok) {
      failed = failure(answer.error_class, std::string(to_string(kind)) + ": " + answer.message);
      return false;
    }
    std::string err;
    auto decoded = messages::decode<schema::EvalResult>(answer.bytes, err);
    if (!decoded) {
      failed = failure(schema::ErrorClass::INTERNAL, "the worker sent a bad result: " + err);
      return false;
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
    if (kind == eval_kind::test)
      result.setCorrect(r.getCorrect());
    return true;
  };
  auto skip_rest = [&](const std::string& why) {
    result.setCorrect(false);
    skip(result, schema::Phase::TEST, why);
    skip(result, schema::Phase::PROFILE, why);
    return finish(result);
  };

  if (!step(eval_kind::lower))
    return failed;
  if (correctness_phase_failed(result.asReader()))
    return skip_rest("the kernel did not load or lower");
  // The structure is what the model prices; extraction failing is a failed profile phase.
  if (!step(eval_kind::extract))
    return failed;
  if (correctness_phase_failed(result.asReader()))  // the candidate crashed or hung tracing
    return skip_rest("the kernel did not load or lower");

  if (s.backend == "model" && result.getHasStructure()) {
    config::chip chip;
    if (!load_request_chip(request, chip, failed))
      return failed;
    auto start = clock_type::now();
    capnp::MallocMessageBuilder profile_msg;
    auto profile = profile_msg.initRoot<schema::Profile>();
    auto priced = model::price_kernel(result.asReader().getStructure(), chip, profile);
    if (!priced.compiles) {
      // The real compiler refuses such a kernel: it does not lower.
      set_phase(result, schema::Phase::LOWER, schema::Status::FAILED,
                schema::ErrorClass::VMEM_OOM, priced.compile_error, seconds_since(start));
      return skip_rest("the kernel does not compile for " + chip.name);
    }
    label(profile, s.backend, chip);
    result.setProfile(profile.asReader());
    result.setHasProfile(true);
    set_phase(result, schema::Phase::PROFILE, schema::Status::OK, schema::ErrorClass::NONE, "",
              seconds_since(start));
  }

  if (request.getOptions().getProfileOnly()) {
    // Asked for the time alone: correctness is not known, so it is not claimed.
    skip(result, schema::Phase::TEST, "not tested: a profile-only request");
    result.setCorrect(false);
  } else {
    if (!step(eval_kind::test))
      return failed;
    if (correctness_phase_failed(result.asReader()))
      result.setCorrect(false);
  }

  // Measured time on the device, whether or not the test passed.
  if (s.backend == "jax-tpu" && !step(eval_kind::time))
    return failed;
  return finish(result);
}

pipeline_outcome run_reference(worker_client& worker, schema::EvalRequest::Reader request,
                               const pipeline_settings& s) {
  capnp::MallocMessageBuilder msg;
  auto result = msg.initRoot<schema::EvalResult>();
  result.setSchemaVersion(schema::SCHEMA_VERSION);
  std::string id = request.getCandidate().getId();
  result.setCandidateId(id.empty() ? "reference" : id);
  result.setBackend(s.backend);
  // The reference defines correctness.
  result.setCorrect(true);

  if (s.backend != "model") {
    set_phase(result, schema::Phase::PROFILE, schema::Status::FAILED, schema::ErrorClass::BAD_INPUT,
              "the " + s.backend + " backend cannot time a spec's reference yet: the JAX worker "
              "times candidates only (WorkerRequest.time); use the model backend for the "
              "reference's time", 0);
    return finish(result);
  }

  config::chip chip;
  pipeline_outcome failed;
  if (!load_request_chip(request, chip, failed))
    return failed;
  auto left = remaining(s);
  if (left <= milliseconds(0))
    return failure(schema::ErrorClass::TIMEOUT, "the deadline passed before analyzing the reference");
  auto start = clock_type::now();
  auto configuration = request.getOptions().getConfiguration();
  auto answer = worker.analyze(request.getSpec(), configuration, left);
  if (!answer.ok)
    return failure(answer.error_class, "analyzing the reference: " + answer.message);
  std::string err;
  auto graph = messages::decode<schema::DataflowGraph>(answer.bytes, err);
  if (!graph)
    return failure(schema::ErrorClass::INTERNAL, "the worker sent a bad dataflow graph: " + err);

  capnp::MallocMessageBuilder profile_msg;
  auto profile = profile_msg.initRoot<schema::Profile>();
  auto priced = model::price_xla(graph->root<schema::DataflowGraph>(), chip, profile);
  if (!priced.compiles) {
    set_phase(result, schema::Phase::PROFILE, schema::Status::FAILED, schema::ErrorClass::VMEM_OOM,
              priced.compile_error, seconds_since(start));
    return finish(result);
  }
  label(profile, s.backend, chip);
  result.setProfile(profile.asReader());
  result.setHasProfile(true);
  set_phase(result, schema::Phase::PROFILE, schema::Status::OK, schema::ErrorClass::NONE, "",
            seconds_since(start));
  return finish(result);
}

}  // namespace

void merge_phases(schema::EvalResult::Builder into, schema::EvalResult::Reader from) {
  auto phases = phases_of(into.asReader());
  for (auto& q : phases_of(from)) {
    auto same = std::find_if(phases.begin(), phases.end(),
                             [&](const phase_copy& p) { return p.phase == q.phase; });
    if (same != phases.end())
      *same = q;
    else
      phases.push_back(q);
  }
  write_phases(into, phases);
}

bool correctness_phase_failed(schema::EvalResult::Reader result) {
  for (auto p : result.getPhases())
    if (p.getStatus() == schema::Status::FAILED && p.getPhase() != schema::Phase::PROFILE)
      return true;
  return false;
}

pipeline_outcome run_evaluation(worker_client& worker, schema::EvalRequest::Reader request,
                                const pipeline_settings& settings) {
  if (settings.backend != "model" && settings.backend != "jax-tpu")
    return failure(schema::ErrorClass::INTERNAL, "unknown backend " + settings.backend);
  return request.getReference() ? run_reference(worker, request, settings)
                                : run_candidate(worker, request, settings);
}

}  // namespace maxkernel::tpu_nodes
