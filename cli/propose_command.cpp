#include "cli/propose_command.hpp"

#include "agents/agent_pool_spawn.hpp"
#include "agents/expert/repair_rules.hpp"
#include "cli/brain_options.hpp"
#include "cli/node_evaluation.hpp"
#include "cli/output_file.hpp"
#include "cli/task_session.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/payload_codec.hpp"
#include "messages/version.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <capnp/message.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <variant>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;
using messages::payload;
using clock_type = std::chrono::steady_clock;

namespace {

// A role's answer, decoded, or the error (with the exit code it maps to).
struct answer {
  std::optional<messages::decoded_message> message;
  std::string error;
  int exit_code = 0;
  template <class T>
  typename T::Reader root() { return message->root<T>(); }
};

template <class Reply, class Actor, class Atom>
answer ask(caf::actor_system& sys, const Actor& actor, Atom atom, capnp::MessageBuilder& request,
           uint64_t type, std::chrono::seconds timeout) {
  answer a;
  caf::scoped_actor self{sys};
  payload p{type, messages::encode(request)};
  self->request(actor, timeout, atom, std::move(p))
    .receive(
      [&](payload& reply) {
        std::string err;
        a.message = messages::open_payload<Reply>(reply, err);
        if (!a.message) {
          a.error = err;
          a.exit_code = 3;
        }
      },
      [&](caf::error& e) {
        a.error = messages::message_of(e);
        a.exit_code = messages::exit_code_for(messages::code_of(e));
        if (a.exit_code == 0)
          a.exit_code = 3;
      });
  return a;
}

struct tally {
  unsigned evaluations = 0, cache_hits = 0;
  std::map<std::string, unsigned> failures;
  uint64_t prompt_tokens = 0, completion_tokens = 0;
  double cost_usd = 0;
  bool has_cost = false;
  json attempts = json::array();

  void count(schema::EvalResult::Reader r) {
    ++evaluations;
    cache_hits += r.getCached() ? 1 : 0;
    if (!r.getCorrect())
      ++failures[agents::expert::failure_class(r)];
  }
  void usage(schema::Usage::Reader u) {
    prompt_tokens += u.getPromptTokens();
    completion_tokens += u.getCompletionTokens();
    cost_usd += u.getCostUsd();
    has_cost = has_cost || u.getHasCost();
  }
};

std::string short_id(const std::string& id) { return id.substr(0, 12); }

std::string params_text(schema::Candidate::Reader c) {
  json p = json::object();
  for (auto x : c.getParams())
    p[x.getName().cStr()] = json::parse(x.getValue().cStr(), nullptr, false);
  return p.dump();
}

// What the propose run keeps of its best candidate.
struct found {
  std::optional<messages::decoded_message> candidate;   // Candidate
  std::optional<messages::decoded_message> result;      // EvalResult (default test)
  std::string verdict;
};

}  // namespace

int run_propose(const propose_options& opts) {
  auto started = clock_type::now();
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  std::string error;
  auto kind = classify_spec(opts.spec, error);
  if (kind == spec_kind::invalid) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  config::brain_config brains;
  if (!load_brains(opts.brains, brains, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (!output_dir_exists(opts.json, error)) {
    std::cerr << "error: --json " << error << "\n";
    return 2;
  }
  task_session task;
  session_flags flags{opts.chip, opts.state_dir, opts.no_store, 0, opts.memory_limit_bytes,
                      opts.deadline_seconds};
  if (int code = open_task_session(opts.spec, kind, flags, task))
    return code;
  // --out is made only once the task is read: a bad spec leaves no directory behind.
  if (!opts.out.empty() && !make_output_dir(opts.out, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  auto& session = *task.session;
  auto spec = task.spec();
  std::string chip_name;
  if (int code = task_chip(opts.chip, spec, chip_name))
    return code;
  auto timeout = std::chrono::seconds(static_cast<long>(opts.deadline_seconds) + 60);

  // The reference's analyze summary: what the brains match and reason on.
  std::optional<messages::decoded_message> graph_msg;
  if (int code = analyze_reference(session, spec, graph_msg, error)) {
    std::cerr << "error: " << error << "\n";
    return code;
  }
  auto graph = graph_msg->root<schema::DataflowGraph>();

  auto& sys = session.system();
  auto pool = agents::spawn_agent_pool(sys, agents::make_brain_chains(brains));
  tally t;
  int exit_code = 0;
  found best;
  json plan_json = json::array();
  std::string plan_message;
  bool no_template = false;

  [&] {
    capnp::MallocMessageBuilder preq_msg;
    auto preq = preq_msg.initRoot<schema::PlannerRequest>();
    preq.setSchemaVersion(schema::SCHEMA_VERSION);
    preq.setSpec(spec);
    preq.setAnalysis(graph);
    preq.setChip(chip_name);
    preq.setMaxSteps(opts.max_steps);
    preq.setSeed(opts.seed);
    auto planned = ask<schema::Plan>(sys, pool.planner, messages::plan_atom::value, preq_msg,
                                     capnp::typeId<schema::PlannerRequest>(), timeout);
    if (!planned.message) {
      std::cerr << "error: planner: " << planned.error << "\n";
      exit_code = planned.exit_code;
      return;
    }
    auto plan = planned.root<schema::Plan>();
    t.usage(plan.getUsage());
    plan_message = plan.getMessage().cStr();
    no_template = plan.getNoTemplate();
    human << fmt::format("plan: {} step(s). {}\n", plan.getSteps().size(), plan_message);
    for (auto s : plan.getSteps()) {
      human << fmt::format("  {} {} (score {:.2f}): {}\n", s.getMove().cStr(),
                           s.getTemplate().cStr(), s.getScore(), s.getRationale().cStr());
      plan_json.push_back({{"move", s.getMove().cStr()}, {"template", s.getTemplate().cStr()},
                           {"rationale", s.getRationale().cStr()},
                           {"expected_effect", s.getExpectedEffect().cStr()},
                           {"brain", s.getBrain().cStr()}, {"score", s.getScore()}});
    }
    if (plan.getSteps().size() == 0)
      return;

    // The tester's cases, chosen once for the task.
    capnp::MallocMessageBuilder treq_msg;
    auto treq = treq_msg.initRoot<schema::TesterRequest>();
    treq.setSchemaVersion(schema::SCHEMA_VERSION);
    treq.setSpec(spec);
    treq.setAnalysis(graph);
    treq.setChip(chip_name);
    treq.setSeed(opts.seed);
    auto tests = ask<schema::TestPlan>(sys, pool.tester, messages::testplan_atom::value, treq_msg,
                                       capnp::typeId<schema::TesterRequest>(), timeout);
    if (!tests.message) {
      std::cerr << "error: tester: " << tests.error << "\n";
      exit_code = tests.exit_code;
      return;
    }
    auto test_plan = tests.root<schema::TestPlan>();

    messages::request_settings settings;
    settings.chip = chip_name;
    for (auto step : plan.getSteps()) {
      capnp::MallocMessageBuilder ireq_msg;
      auto ireq = ireq_msg.initRoot<schema::ImplementRequest>();
      ireq.setSchemaVersion(schema::SCHEMA_VERSION);
      ireq.setSpec(spec);
      ireq.setAnalysis(graph);
      ireq.setStep(step);
      ireq.setChip(chip_name);
      auto impl = ask<schema::ImplementReply>(sys, pool.implementer,
                                              messages::implement_atom::value, ireq_msg,
                                              capnp::typeId<schema::ImplementRequest>(), timeout);
      if (!impl.message) {
        human << "  implementer: " << impl.error << "\n";
        t.attempts.push_back({{"step", step.getMove().cStr()}, {"error", impl.error}});
        continue;
      }
      t.usage(impl.root<schema::ImplementReply>().getUsage());
      capnp::MallocMessageBuilder cand_msg;
      cand_msg.setRoot(impl.root<schema::ImplementReply>().getCandidate());
      std::vector<std::string> tried;
      for (unsigned attempt = 0;; ++attempt) {
        auto cand = cand_msg.getRoot<schema::Candidate>().asReader();
        auto ev = evaluate(session, spec, cand.getSource().cStr(), cand.getOrigin().cStr(),
                           settings);
        if (ev.exit_code != 0) {
          std::cerr << "error: " << ev.error << "\n";
          exit_code = ev.exit_code;
          return;
        }
        auto result = ev.result();
        t.count(result);
        std::optional<evaluated> failed_case;
        std::string verdict_text;
        if (result.getCorrect()) {
          // The tester's cases, then its verdict.
          capnp::MallocMessageBuilder jreq_msg;
          auto jreq = jreq_msg.initRoot<schema::JudgeRequest>();
          jreq.setSchemaVersion(schema::SCHEMA_VERSION);
          jreq.setSpec(spec);
          jreq.setPlan(test_plan);
          auto results = jreq.initResults(test_plan.getCases().size());
          std::vector<evaluated> case_results;
          for (unsigned i = 0; i < test_plan.getCases().size(); ++i) {
            auto c = test_plan.getCases()[i];
            capnp::MallocMessageBuilder req_msg;
            auto req = req_msg.initRoot<schema::EvalRequest>();
            messages::build_eval_request(req, spec, cand.getSource().cStr(),
                                          cand.getOrigin().cStr(), settings);
            auto chip_of_request = std::string(req.getOptions().getChip().cStr());
            req.setOptions(c.getOptions());
            req.getOptions().setChip(chip_of_request);
            auto answer_bytes = session.evaluate(messages::encode(req_msg));
            evaluated e;
            e.exit_code = answer_bytes.exit_code;
            e.error = answer_bytes.error;
            if (e.exit_code == 0)
              e.message = messages::decode<schema::EvalResult>(answer_bytes.bytes, e.error);
            if (!e.message) {
              std::cerr << "error: test case " << c.getName().cStr() << ": " << e.error << "\n";
              exit_code = e.exit_code ? e.exit_code : 3;
              return;
            }
            t.count(e.result());
            results.setWithCaveats(i, e.result());
            case_results.push_back(std::move(e));
          }
          auto judged = ask<schema::Verdict>(sys, pool.tester, messages::judge_atom::value,
                                             jreq_msg, capnp::typeId<schema::JudgeRequest>(),
                                             timeout);
          if (!judged.message) {
            std::cerr << "error: tester: " << judged.error << "\n";
            exit_code = judged.exit_code;
            return;
          }
          auto verdict = judged.root<schema::Verdict>();
          verdict_text = verdict.getSummary().cStr();
          if (verdict.getCorrect()) {
            human << fmt::format("  candidate {} ({} {}): correct; {}\n",
                                 short_id(cand.getId().cStr()), cand.getTemplate().cStr(),
                                 params_text(cand), verdict_text);
            t.attempts.push_back({{"candidate", cand.getId().cStr()},
                                  {"strategy", cand.getStrategy().cStr()},
                                  {"outcome", "correct"}, {"tests", verdict_text}});
            best.candidate = messages::decode<schema::Candidate>(
              messages::encode_root(cand), error);
            best.result = std::move(ev.message);
            best.verdict = verdict_text;
            return;
          }
          failed_case = std::move(case_results[static_cast<unsigned>(
            std::max(0, verdict.getFailedCase()))]);
        }
        auto failed = failed_case ? failed_case->result() : result;
        std::string cls = agents::expert::failure_class(failed);
        std::string why = agents::expert::failure_message(failed);
        if (why.empty() && !verdict_text.empty())
          why = verdict_text;
        human << fmt::format("  candidate {} ({} {}): {}: {}\n", short_id(cand.getId().cStr()),
                             cand.getTemplate().cStr(), params_text(cand), cls,
                             why.substr(0, why.find('\n')));
        t.attempts.push_back({{"candidate", cand.getId().cStr()},
                              {"strategy", cand.getStrategy().cStr()}, {"outcome", cls},
                              {"message", why.substr(0, 500)}});
        if (attempt >= opts.max_repairs)
          break;
        capnp::MallocMessageBuilder dreq_msg;
        auto dreq = dreq_msg.initRoot<schema::DebugRequest>();
        dreq.setSchemaVersion(schema::SCHEMA_VERSION);
        dreq.setSpec(spec);
        dreq.setAnalysis(graph);
        dreq.setCandidate(cand);
        dreq.setResult(failed);
        dreq.setAttempt(attempt + 1);
        dreq.setMaxAttempts(opts.max_repairs);
        dreq.setChip(chip_name);
        auto tried_list = dreq.initTried(static_cast<unsigned>(tried.size()));
        for (unsigned i = 0; i < tried.size(); ++i)
          tried_list.set(i, tried[i]);
        auto dbg = ask<schema::DebugReply>(sys, pool.debugger, messages::debug_atom::value,
                                           dreq_msg, capnp::typeId<schema::DebugRequest>(),
                                           timeout);
        if (!dbg.message) {
          human << "  debugger: " << dbg.error << "\n";
          break;
        }
        auto rep = dbg.root<schema::DebugReply>();
        t.usage(rep.getUsage());
        if (!rep.getRepaired()) {
          human << "  debugger gives up: " << rep.getReason().cStr() << "\n";
          break;
        }
        human << "  debugger: " << rep.getFix().cStr() << "\n";
        tried.push_back(rep.getFix().cStr());
        cand_msg.setRoot(rep.getCandidate());
      }
    }
  }();
  if (exit_code != 0) {
    agents::stop_agent_pool(pool);
    return exit_code;
  }
  if (!best.candidate && no_template && !brains.llm) {
    agents::stop_agent_pool(pool);
    std::cerr << "error: " << spec.getName().cStr() << ": " << plan_message
              << "; no LLM brain is configured (--brains FILE)\n";
    return 2;
  }

  // The reference's time, the baseline's when the spec has one, and the profiler's reading.
  auto times = time_reference_and_baseline(session, spec, chip_name);
  t.evaluations += times.evaluations;
  t.cache_hits += times.cache_hits;
  double reference_us = times.reference_us, baseline_us = times.baseline_us;
  json diagnosis = nullptr;
  bool correct = best.candidate.has_value();
  double kernel_us = 0, roofline_us = 0;
  std::string timing = "modeled";
  if (correct) {
    auto r = best.result->root<schema::EvalResult>();
    if (r.getHasProfile()) {
      kernel_us = r.getProfile().getTimeUs();
      roofline_us = r.getProfile().getRooflineUs();
      timing = r.getProfile().getTiming() == schema::Timing::MEASURED ? "measured" : "modeled";
      capnp::MallocMessageBuilder dmsg;
      auto dreq = dmsg.initRoot<schema::ProfilerRequest>();
      dreq.setSchemaVersion(schema::SCHEMA_VERSION);
      dreq.setProfile(r.getProfile());
      dreq.setHasStructure(r.getHasStructure());
      if (r.getHasStructure())
        dreq.setStructure(r.getStructure());
      dreq.setChip(chip_name);
      auto d = ask<schema::Diagnosis>(sys, pool.profiler, messages::diagnose_atom::value, dmsg,
                                      capnp::typeId<schema::ProfilerRequest>(), timeout);
      if (d.message) {
        auto dr = d.root<schema::Diagnosis>();
        diagnosis = {{"bound", dr.getBound().cStr()}, {"headroom", dr.getHeadroom()},
                     {"bottleneck", dr.getBottleneckCallName().cStr()},
                     {"suggestions", json::array()}};
        for (auto s : dr.getSuggestions())
          diagnosis["suggestions"].push_back(s.getRationale().cStr());
      }
    }
  }
  agents::stop_agent_pool(pool);
  double wall = std::chrono::duration<double>(clock_type::now() - started).count();
  auto nullable = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  double speedup = correct && kernel_us > 0 && reference_us > 0 ? reference_us / kernel_us : 1.0;
  json failures = json::object();
  for (const auto& [k, v] : t.failures)
    failures[k] = v;
  json result = {
    {"schema", 1},
    {"task", spec.getName().cStr()},
    {"mode", "propose"},
    {"chip", chip_name},
    {"backend", session.backend()},
    {"timing", timing},
    {"correct", correct},
    {"fallback_to_reference", !correct},
    {"kernel_time_us", correct ? nullable(kernel_us) : nullable(reference_us)},
    {"reference_time_us", nullable(reference_us)},
    {"baseline_time_us", nullable(baseline_us)},
    {"speedup_vs_reference", speedup},
    {"speedup_vs_baseline",
     baseline_us > 0 && correct && kernel_us > 0 ? json(baseline_us / kernel_us) : json(nullptr)},
    {"roofline_time_us", nullable(roofline_us)},
    {"roofline_fraction",
     roofline_us > 0 && kernel_us > 0 ? json(roofline_us / kernel_us) : json(nullptr)},
    {"evaluations", t.evaluations},
    {"cache_hits", t.cache_hits},
    {"failures", failures},
    {"wall_seconds", wall},
    {"tokens", {{"prompt", t.prompt_tokens}, {"completion", t.completion_tokens}}},
    {"cost_usd", t.has_cost ? json(t.cost_usd) : json(nullptr)},
    {"seed", opts.seed},
    {"jax_version", session.jax_version()},
    {"maxkernel_version", messages::maxkernel_version()},
    {"plan", plan_json},
    {"attempts", t.attempts},
    {"diagnosis", diagnosis},
  };
  std::string kernel_source;
  if (correct) {
    auto c = best.candidate->root<schema::Candidate>();
    result["candidate"] = {{"id", c.getId().cStr()}, {"template", c.getTemplate().cStr()},
                           {"params", json::parse(params_text(c))},
                           {"origin", c.getOrigin().cStr()},
                           {"strategy", c.getStrategy().cStr()}, {"tests", best.verdict}};
    kernel_source = fmt::format(
      "# maxkernel propose: task {}, chip {}\n# {} {}\n# time {:.2f} us ({}), reference {:.2f} us, "
      "speedup {:.2f}x\n# JAX {}, maxkernel {}\n",
      spec.getName().cStr(), chip_name, c.getTemplate().size() ? c.getTemplate().cStr()
                                                               : c.getOrigin().cStr(),
      params_text(c), kernel_us, timing, reference_us, speedup, session.jax_version(),
      messages::maxkernel_version());
    kernel_source += c.getSource().cStr();
  } else {
    // The reference itself, callable as the kernel file's workload.
    kernel_source = fmt::format("# maxkernel propose: task {}: no correct kernel was found; this "
                                "is the reference (fallback)\n",
                                spec.getName().cStr());
    kernel_source += spec.getReference().cStr();
    std::string entry = spec.getReferenceEntry().cStr();
    if (!entry.empty() && entry != "workload")
      kernel_source += fmt::format("\n\nworkload = {}\n", entry);
  }
  human << fmt::format(
    "{}: {} kernel {}; reference {:.2f} us, speedup {:.2f}x ({}), {} evaluations, {:.1f} s\n",
    spec.getName().cStr(), correct ? "correct" : "no correct",
    correct ? fmt::format("{:.2f} us", kernel_us) : "(fallback to the reference)", reference_us,
    speedup, timing, t.evaluations, wall);
  if (!opts.out.empty()) {
    if (!write_output((fs::path(opts.out) / "kernel.py").string(), kernel_source, error) ||
        !write_output((fs::path(opts.out) / "result.json").string(), result.dump(2) + "\n",
                      error)) {
      std::cerr << "error: " << error << "\n";
      return 3;
    }
    human << "wrote " << (fs::path(opts.out) / "kernel.py").string() << " and result.json\n";
  }
  if (!opts.json.empty() && !write_output(opts.json, result.dump(2) + "\n", error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return correct ? 0 : 1;
}

}  // namespace maxkernel::cli
