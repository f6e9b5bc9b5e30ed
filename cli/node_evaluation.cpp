#include "cli/node_evaluation.hpp"

#include "maxkernel/schema/worker.capnp.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <iterator>

#include <capnp/message.h>

namespace maxkernel::cli {

evaluated evaluate(node_session& session, schema::KernelSpec::Reader spec,
                   const std::string& source, const std::string& origin,
                   const messages::request_settings& settings) {
  capnp::MallocMessageBuilder msg;
  messages::build_eval_request(msg.initRoot<schema::EvalRequest>(), spec, source, origin, settings);
  evaluated out;
  auto answer = session.evaluate(messages::encode(msg));
  if (answer.exit_code != 0) {
    out.exit_code = answer.exit_code;
    out.error = answer.error;
    out.timed_out = answer.timed_out;
    return out;
  }
  out.message = messages::decode<schema::EvalResult>(answer.bytes, out.error);
  if (!out.message) {
    out.exit_code = 3;
    out.error = "the TPU node sent a bad result: " + out.error;
  }
  return out;
}

std::optional<schema::PhaseResult::Reader> failed_phase(schema::EvalResult::Reader r) {
  for (auto p : r.getPhases())
    if (p.getStatus() == schema::Status::FAILED)
      return p;
  return std::nullopt;
}

std::string failure_of(schema::EvalResult::Reader r) {
  auto p = failed_phase(r);
  return p ? p->getMessage().cStr() : "no profile";
}

std::string reference_hangs(schema::KernelSpec::Reader spec, const node_session& session,
                            const char* while_doing) {
  std::string where = spec.getSourcePath().size() ? spec.getSourcePath().cStr()
                                                  : spec.getName().cStr();
  return fmt::format("{}: the reference did not finish within {:g} s {} (does it loop "
                     "forever?); --deadline sets the limit",
                     where, std::chrono::duration<double>(session.deadline()).count(),
                     while_doing);
}

reference_times time_reference_and_baseline(node_session& session, schema::KernelSpec::Reader spec,
                                            const std::string& chip,
                                            const std::string& store_scope) {
  reference_times t;
  messages::request_settings settings;
  settings.chip = chip;
  settings.store_scope = store_scope;
  settings.reference = true;
  auto reference = evaluate(session, spec, "", "reference", settings);
  if (reference.exit_code == 0) {
    ++t.evaluations;
    t.cache_hits += reference.result().getCached() ? 1 : 0;
    if (reference.result().getHasProfile())
      t.reference_us = reference.result().getProfile().getTimeUs();
  }
  std::string baseline_path = spec.getBaselinePath().cStr();
  if (!baseline_path.empty()) {
    std::ifstream f(baseline_path);
    std::string source((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    messages::request_settings bs;
    bs.chip = chip;
    bs.profile_only = true;
    bs.store_scope = store_scope;
    auto baseline = evaluate(session, spec, source, baseline_path, bs);
    if (baseline.exit_code == 0) {
      ++t.evaluations;
      t.cache_hits += baseline.result().getCached() ? 1 : 0;
      if (baseline.result().getHasProfile())
        t.baseline_us = baseline.result().getProfile().getTimeUs();
    }
  }
  return t;
}

int analyze_reference(node_session& session, schema::KernelSpec::Reader spec,
                      std::optional<messages::decoded_message>& graph, std::string& error) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::AnalyzeRequest>();
  req.setSpec(spec);
  req.setConfiguration(0);
  auto analyzed = session.analyze(messages::encode(msg));
  if (analyzed.timed_out) {
    error = reference_hangs(spec, session, "while it was traced");
    return 2;
  }
  if (analyzed.exit_code != 0) {
    error = "analyze: " + analyzed.error;
    return analyzed.exit_code;
  }
  graph = messages::decode<schema::DataflowGraph>(analyzed.bytes, error);
  if (!graph) {
    error = "analyze: " + error;
    return 3;
  }
  graph->allow_rereading();
  return 0;
}

}  // namespace maxkernel::cli
