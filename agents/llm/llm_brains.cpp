#include "agents/llm/llm_brains.hpp"

#include "agents/llm/chat_client.hpp"
#include "agents/llm/code_reply.hpp"
#include "agents/llm/conversation.hpp"
#include "agents/llm/plan_reply.hpp"
#include "agents/llm/prompt_sections.hpp"
#include "agents/llm/prompt_text.hpp"
#include "config/chip_loader.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "messages/source_candidate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace maxkernel::agents::llm {
namespace {

using messages::error_code;
constexpr unsigned default_steps = 3;

brain_status load_chip(schema::KernelSpec::Reader spec, const std::string& requested,
                       config::chip& chip) {
  std::string name = requested.empty() ? std::string(spec.getChip().cStr()) : requested;
  if (name.empty())
    return brain_status::fail(error_code::bad_input, "no chip: neither the request nor the spec "
                                                     "names one");
  config::spec_error err;
  if (!config::load_chip(name, chip, err))
    return brain_status::fail(error_code::bad_input, "chip: " + err.what());
  return {};
}

// The system prompt: Pallas TPU knowledge and the chip's numbers.
brain_status system_prompt(const config::chip& chip, std::string& out) {
  std::string error;
  if (!fill_prompt("pallas_tpu.md", {{"chip", render_chip(chip)}}, out, error))
    return brain_status::fail(error_code::internal, error);
  return {};
}

brain_status user_prompt(const std::string& file, const std::map<std::string, std::string>& values,
                         std::string& out) {
  std::string error;
  if (!fill_prompt(file, values, out, error))
    return brain_status::fail(error_code::internal, error);
  return {};
}

// Equal up to trailing whitespace: the model "changed" nothing.
bool same_code(const std::string& a, const std::string& b) {
  auto norm = [](const std::string& s) {
    std::string out, line;
    for (char c : s + "\n") {
      if (c == '\n') {
        while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r'))
          line.pop_back();
        out += line + "\n";
        line.clear();
      } else {
        line += c;
      }
    }
    while (out.size() > 1 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n')
      out.pop_back();
    return out;
  };
  return norm(a) == norm(b);
}

std::string fenced(const std::string& source) {
  std::string s = "```python\n" + source;
  if (!source.empty() && source.back() != '\n')
    s += "\n";
  return s + "```";
}

void fill_candidate(schema::Candidate::Builder c, const std::string& source,
                    const std::string& parent_id, const std::string& strategy,
                    const std::string& model) {
  messages::fill_source_candidate(c, source, parent_id, strategy, "llm:" + model);
}

// Each brain writes its usage whatever happens: the role chain sums it even when a brain
// fails and the next one answers.
template <class Builder>
brain_status finish(Builder out, const usage_tally& tally, const config::llm_config& c,
                    brain_status status) {
  tally.write(out.initUsage(), c.prices);
  return status;
}

// ---- Planner ------------------------------------------------------------------------------

class llm_planner final : public planner_brain {
public:
  explicit llm_planner(config::llm_config c) : client_(std::move(c)) {}
  std::string name() const override { return "llm"; }

  brain_status plan(schema::PlannerRequest::Reader req, schema::Plan::Builder out) override {
    usage_tally tally;
    out.setSchemaVersion(schema::SCHEMA_VERSION);
    return finish(out, tally, client_.config(), run(req, out, tally));
  }

private:
  brain_status run(schema::PlannerRequest::Reader req, schema::Plan::Builder out,
                   usage_tally& tally) const {
    config::chip chip;
    if (auto s = load_chip(req.getSpec(), req.getChip().cStr(), chip); !s.ok())
      return s;
    auto history = req.getHistory();
    std::vector<std::string> ids;
    for (auto e : history)
      ids.emplace_back(e.getCandidate().getId().cStr());
    unsigned max_steps = req.getMaxSteps() ? req.getMaxSteps() : default_steps;

    std::string best = "(none yet: every step writes a kernel from scratch)";
    std::string profile = "(none yet)";
    std::string diagnosis = "(none yet)";
    if (int b = best_entry(history); b >= 0) {
      auto e = history[static_cast<unsigned>(b)];
      auto r = e.getResult();
      best = fmt::format("id {} ({}):\n{}", e.getCandidate().getId().cStr(),
                         r.getCorrect() ? "the fastest correct candidate"
                                        : "the latest candidate; none is correct yet",
                         fenced(e.getCandidate().getSource().cStr()));
      if (r.getHasStructure())
        best += "\n\nIts structure:\n" + render_structure(r.getStructure());
      if (r.getHasProfile())
        profile = render_profile(r.getProfile());
      else
        profile = "(no profile: the candidate did not lower)\n" + render_failure(r);
      if (e.getHasDiagnosis())
        diagnosis = render_diagnosis(e.getDiagnosis());
    }
    // hitl: the operator's feedback and hints, after the diagnosis they qualify.
    if (req.getGuidance().size() > 0) {
      diagnosis += "\n\nThe operator's feedback and hints on earlier candidates (follow them):";
      for (auto g : req.getGuidance())
        diagnosis += "\n- " + std::string(g.cStr());
    }
    std::string system, user;
    if (auto s = system_prompt(chip, system); !s.ok())
      return s;
    if (auto s = user_prompt("planner.md",
                             {{"spec", render_spec(req.getSpec())},
                              {"analysis", render_analysis(req.getAnalysis())},
                              {"history", render_history(history)},
                              {"best", best},
                              {"profile", profile},
                              {"diagnosis", diagnosis},
                              {"max_steps", std::to_string(max_steps)}},
                             user);
        !s.ok())
      return s;

    std::vector<planned_step> steps;
    auto accept = [&](const chat_completion& reply, std::string& error) {
      return parse_plan_reply(reply.content, ids, steps, error);
    };
    if (auto s = converse(client_, system, user, accept, tally); !s.ok())
      return s;

    std::stable_sort(steps.begin(), steps.end(),
                     [](const planned_step& a, const planned_step& b) { return a.score > b.score; });
    if (steps.size() > max_steps)
      steps.resize(max_steps);
    auto list = out.initSteps(static_cast<unsigned>(steps.size()));
    for (unsigned i = 0; i < steps.size(); ++i) {
      const planned_step& p = steps[i];
      auto s = list[i];
      s.setMove(p.move);
      s.setTemplate("");
      s.setParentId(p.parent_id);
      auto changes = s.initChanges(static_cast<unsigned>(p.changes.size()));
      for (unsigned k = 0; k < p.changes.size(); ++k) {
        changes[k].setName(p.changes[k].first);
        changes[k].setValue(p.changes[k].second);
      }
      s.setRationale(p.rationale);
      s.setExpectedEffect(p.expected_effect);
      s.setScore(p.score);
      s.setBrain("llm");
      s.setInstructions(p.instructions);
    }
    out.setNoTemplate(false);
    out.setMessage(fmt::format("{} step{} from llm:{}", steps.size(),
                               steps.size() == 1 ? "" : "s", client_.config().model));
    return {};
  }

  chat_client client_;
};

// ---- Implementer --------------------------------------------------------------------------

class llm_implementer final : public implementer_brain {
public:
  explicit llm_implementer(config::llm_config c) : client_(std::move(c)) {}
  std::string name() const override { return "llm"; }

  brain_status implement(schema::ImplementRequest::Reader req,
                         schema::ImplementReply::Builder out) override {
    usage_tally tally;
    out.setSchemaVersion(schema::SCHEMA_VERSION);
    return finish(out, tally, client_.config(), run(req, out, tally));
  }

private:
  brain_status run(schema::ImplementRequest::Reader req, schema::ImplementReply::Builder out,
                   usage_tally& tally) const {
    auto step = req.getStep();
    if (step.getParentId().size() && !req.getHasParent())
      return brain_status::fail(error_code::bad_input,
                                fmt::format("the step applies to candidate {} but the request "
                                            "carries no parent",
                                            step.getParentId().cStr()));
    config::chip chip;
    if (auto s = load_chip(req.getSpec(), req.getChip().cStr(), chip); !s.ok())
      return s;
    std::string parent_source = "(none: write the kernel from scratch)";
    std::string parent_code;
    if (req.getHasParent()) {
      auto p = req.getParent();
      parent_code = p.getSource().cStr();
      parent_source = fmt::format("id {}{}{}:\n{}", p.getId().cStr(),
                                  p.getStrategy().size()
                                      ? fmt::format(", made by {}", p.getStrategy().cStr())
                                      : "",
                                  p.getParams().size()
                                      ? fmt::format(", params {}", render_params(p.getParams()))
                                      : "",
                                  fenced(parent_code));
    }
    std::string system, user;
    if (auto s = system_prompt(chip, system); !s.ok())
      return s;
    if (auto s = user_prompt("implementer.md",
                             {{"spec", render_spec(req.getSpec())},
                              {"analysis", render_analysis(req.getAnalysis())},
                              {"step", render_step(step)},
                              {"parent_source", parent_source}},
                             user);
        !s.ok())
      return s;

    code_reply code;
    bool has_parent = req.getHasParent();
    auto accept = [&](const chat_completion& reply, std::string& error) {
      if (!parse_code_reply(reply.content, reply.finish_reason, code, error))
        return false;
      if (has_parent && same_code(code.source, parent_code)) {
        error = "the module is identical to the parent kernel: apply the plan step to it and "
                "reply with the changed module";
        return false;
      }
      return true;
    };
    if (auto s = converse(client_, system, user, accept, tally); !s.ok())
      return s;
    fill_candidate(out.initCandidate(), code.source,
                   has_parent ? std::string(req.getParent().getId().cStr()) : std::string(),
                   step.getMove().cStr(), client_.config().model);
    return {};
  }

  chat_client client_;
};

// ---- Debugger -----------------------------------------------------------------------------

class llm_debugger final : public debugger_brain {
public:
  explicit llm_debugger(config::llm_config c) : client_(std::move(c)) {}
  std::string name() const override { return "llm"; }

  brain_status debug(schema::DebugRequest::Reader req, schema::DebugReply::Builder out) override {
    usage_tally tally;
    out.setSchemaVersion(schema::SCHEMA_VERSION);
    return finish(out, tally, client_.config(), run(req, out, tally));
  }

private:
  brain_status run(schema::DebugRequest::Reader req, schema::DebugReply::Builder out,
                   usage_tally& tally) const {
    if (req.getMaxAttempts() > 0 && req.getAttempt() > req.getMaxAttempts()) {
      out.setRepaired(false);
      out.setReason(fmt::format("gave up after {} attempts", req.getMaxAttempts()));
      return {};
    }
    config::chip chip;
    if (auto s = load_chip(req.getSpec(), req.getChip().cStr(), chip); !s.ok())
      return s;
    auto cand = req.getCandidate();
    std::string failing = cand.getSource().cStr();
    std::string tried;
    for (auto t : req.getTried())
      tried += fmt::format("- {}\n", t.cStr());
    if (tried.empty())
      tried = "(none)";
    std::string attempt =
        req.getMaxAttempts() ? fmt::format("{} of {}", std::max(1u, req.getAttempt()),
                                           req.getMaxAttempts())
                             : std::to_string(std::max(1u, req.getAttempt()));
    std::string system, user;
    if (auto s = system_prompt(chip, system); !s.ok())
      return s;
    if (auto s = user_prompt("debugger.md",
                             {{"spec", render_spec(req.getSpec())},
                              {"analysis", render_analysis(req.getAnalysis())},
                              {"source", failing},
                              {"error", render_failure(req.getResult())},
                              {"attempt", attempt},
                              {"tried", tried}},
                             user);
        !s.ok())
      return s;

    repair_reply repair;
    auto accept = [&](const chat_completion& reply, std::string& error) {
      if (!parse_repair_reply(reply.content, reply.finish_reason, repair, error))
        return false;
      if (!repair.gave_up && same_code(repair.source, failing)) {
        error = "the module is identical to the failing kernel: change what the error requires";
        return false;
      }
      return true;
    };
    if (auto s = converse(client_, system, user, accept, tally); !s.ok())
      return s;
    if (repair.gave_up) {
      out.setRepaired(false);
      out.setReason(repair.reason);
      return {};
    }
    std::string fix = repair.fix.empty() ? "llm repair" : repair.fix;
    fill_candidate(out.initCandidate(), repair.source, cand.getId().cStr(), "repair: " + fix,
                   client_.config().model);
    out.setRepaired(true);
    out.setFix(fix);
    out.setReason(repair.cause);
    return {};
  }

  chat_client client_;
};

}  // namespace

planner_brain_ptr make_llm_planner(const config::llm_config& config) {
  return std::make_shared<llm_planner>(config);
}
implementer_brain_ptr make_llm_implementer(const config::llm_config& config) {
  return std::make_shared<llm_implementer>(config);
}
debugger_brain_ptr make_llm_debugger(const config::llm_config& config) {
  return std::make_shared<llm_debugger>(config);
}

}  // namespace maxkernel::agents::llm
