#include "agents/expert/expert_brains.hpp"

#include "agents/expert/move_evidence.hpp"
#include "agents/expert/param_check.hpp"
#include "agents/expert/playbook.hpp"
#include "agents/expert/repair_rules.hpp"
#include "agents/expert/template_registry.hpp"
#include "config/chip_loader.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "messages/content_hash.hpp"

#include <fmt/format.h>

#include <map>
#include <set>

namespace maxkernel::agents::expert {
namespace {

using messages::error_code;
constexpr unsigned kDefaultSteps = 3;
constexpr double kMiB = 1024.0 * 1024.0;
// Below every move not known to hurt (the playbook scores its moves within 0..10).
constexpr double kHurtPenalty = 20.0;

brain_status load_chip(const std::string& name, config::chip& chip) {
  config::spec_error err;
  if (!config::load_chip(name, chip, err))
    return brain_status::fail(error_code::bad_input, "chip: " + err.what());
  return {};
}

void set_changes(capnp::List<schema::Param>::Builder list, const nlohmann::json& changes) {
  unsigned i = 0;
  for (const auto& [k, v] : changes.items()) {
    list[i].setName(k);
    list[i].setValue(v.dump());
    ++i;
  }
}

// The template a request names, matched again on the analysis (render needs its facts).
brain_status rematch(const std::vector<template_ptr>& templates, const std::string& name,
                     schema::DataflowGraph::Reader analysis, schema::KernelSpec::Reader spec,
                     template_ptr& t, template_match& m) {
  t = nullptr;
  for (const auto& c : templates)
    if (c->name() == name)
      t = c;
  if (!t)
    return brain_status::fail(error_code::bad_input, "no expert template named " + name);
  graph_view graph(analysis);
  auto found = t->match(graph, spec);
  if (!found)
    return brain_status::fail(error_code::bad_input,
                              "template " + name + " does not match this reference");
  m = std::move(*found);
  return {};
}

brain_status render_candidate(const kernel_template& t, const template_match& m,
                              const nlohmann::json& params, const std::string& parent_id,
                              const std::string& strategy, schema::Candidate::Builder out) {
  std::string source, error;
  if (!t.render(m, params, source, error))
    return brain_status::fail(error_code::bad_input, t.name() + ": " + error);
  out.setSchemaVersion(schema::SCHEMA_VERSION);
  out.setId(messages::sha256_hex(source));
  out.setSource(source);
  auto list = out.initParams(static_cast<unsigned>(params.size()));
  set_changes(list, params);
  out.setParentId(parent_id);
  out.setStrategy(strategy);
  out.setOrigin("expert");
  out.setTemplate(t.name());
  return {};
}

// The registry's templates unless a list is given.
std::vector<template_ptr> or_all(std::vector<template_ptr> templates) {
  return templates.empty() ? all_templates() : templates;
}

class expert_planner final : public planner_brain {
public:
  explicit expert_planner(std::vector<template_ptr> t) : templates_(or_all(std::move(t))) {}
  std::string name() const override { return "expert"; }

  brain_status plan(schema::PlannerRequest::Reader req, schema::Plan::Builder out) override {
    config::chip chip;
    if (auto s = load_chip(req.getChip().cStr(), chip); !s.ok())
      return s;
    out.setSchemaVersion(schema::SCHEMA_VERSION);
    unsigned max_steps = req.getMaxSteps() ? req.getMaxSteps() : kDefaultSteps;
    graph_view graph(req.getAnalysis());
    auto matches = match_templates(templates_, graph, req.getSpec());
    if (matches.empty()) {
      out.setNoTemplate(true);
      out.setMessage(no_template_message(graph));
      return {};
    }
    // What was tried, and the best correct candidate to move from.
    search_so_far known;
    auto& seen = known.seen;
    std::set<std::string> tried_templates;
    int best = -1;
    double best_us = 0;
    auto history = req.getHistory();
    std::string expand = req.getParentId().cStr();
    for (unsigned i = 0; i < history.size(); ++i) {
      auto c = history[i].getCandidate();
      if (c.getTemplate().size() == 0)
        continue;
      tried_templates.insert(c.getTemplate().cStr());
      auto key = params_key(c.getTemplate().cStr(), candidate_params(c));
      seen.insert(key);
      auto r = history[i].getResult();
      if (r.getCorrect() && r.getHasProfile() && r.getProfile().getTimeUs() > 0)
        known.timed[key] = r.getProfile().getTimeUs();
      if (!expand.empty()) {
        // The graph search names the vertex to expand (the last entry of that id: a
        // candidate evaluated twice keeps its latest result).
        if (expand == c.getId().cStr() && r.getCorrect() && r.getHasProfile())
          best = static_cast<int>(i);
        continue;
      }
      if (r.getCorrect() && r.getHasProfile() &&
          (best < 0 || r.getProfile().getTimeUs() < best_us)) {
        best = static_cast<int>(i);
        best_us = r.getProfile().getTimeUs();
      }
    }
    struct step {
      std::string move, tmpl, parent, rationale, effect, signature;
      nlohmann::json changes;
      double score;
    };
    std::vector<step> steps;
    if (best >= 0) {
      auto entry = history[static_cast<unsigned>(best)];
      auto parent = entry.getCandidate();
      std::string tname = parent.getTemplate().cStr();
      move_evidence evidence(history);
      auto parent_params = candidate_params(parent);
      known.parent_us = entry.getResult().getProfile().getTimeUs();
      known.findings = evidence.findings(tname);
      for (const auto& mt : matches) {
        if (mt.tmpl->name() != tname)
          continue;
        auto diag = entry.getDiagnosis();
        const schema::Diagnosis::Reader* dp = entry.getHasDiagnosis() ? &diag : nullptr;
        auto moves = playbook_moves(*mt.tmpl, mt.match, parent_params, chip, dp, known);
        for (auto& mv : moves) {
          std::string why = mv.rationale;
          // A change that never made a candidate faster in this search goes after the rest.
          auto sig = move_signature(parent_params, mv.params);
          if (evidence.keeps_hurting(tname, sig)) {
            mv.score -= kHurtPenalty;
            why += fmt::format(" (this change, {}, was tried {} times in this search and never "
                               "made a candidate faster: offered after the others)",
                               sig, evidence.of(tname, sig).tried);
          }
          if (dp)
            why = fmt::format("{}-bound at {:.0f}% of roofline ({:.1f} us, roofline {:.1f} us): {}",
                              dp->getBound().cStr(), 100 * dp->getHeadroom(), dp->getTimeUs(),
                              dp->getRooflineUs(), why);
          steps.push_back({mv.name, tname, parent.getId().cStr(), why, mv.expected_effect,
                           tname + ":" + sig, mv.changes, mv.score});
        }
      }
    }
    // Templates not tried yet are alternatives (first when nothing correct exists yet); a
    // named parent gets its own moves only.
    double base = best >= 0 ? 0.5 : 100.0;
    for (const auto& mt : matches) {
      if (!expand.empty())
        break;
      if (tried_templates.count(mt.tmpl->name()))
        continue;
      auto params = mt.tmpl->initial_params(mt.match, chip);
      if (!fit_vmem(*mt.tmpl, mt.match, params, chip))
        continue;
      auto need = mt.tmpl->vmem_bytes(mt.match, params);
      steps.push_back({"template", mt.tmpl->name(), "",
                       fmt::format("recognised {}: {}", mt.match.summary, mt.tmpl->covers()),
                       fmt::format("a first {} kernel; VMEM {:.1f} of {:.1f} MiB",
                                   mt.tmpl->name(), need / kMiB, vmem_limit(params, chip) / kMiB),
                       "", params, base + mt.match.score});
    }
    std::stable_sort(steps.begin(), steps.end(),
                     [](const step& a, const step& b) { return a.score > b.score; });
    if (steps.size() > max_steps)
      steps.resize(max_steps);
    auto list = out.initSteps(static_cast<unsigned>(steps.size()));
    for (unsigned i = 0; i < steps.size(); ++i) {
      auto s = list[i];
      s.setMove(steps[i].move);
      s.setTemplate(steps[i].tmpl);
      s.setParentId(steps[i].parent);
      set_changes(s.initChanges(static_cast<unsigned>(steps[i].changes.size())),
                  steps[i].changes);
      s.setRationale(steps[i].rationale);
      s.setExpectedEffect(steps[i].effect);
      s.setScore(steps[i].score);
      s.setBrain("expert");
      s.setSignature(steps[i].signature);
    }
    std::vector<std::string> names;
    for (const auto& mt : matches)
      names.push_back(mt.tmpl->name());
    out.setMessage(steps.empty() && !expand.empty() && best < 0
                     ? "the candidate to expand is not a correct one of the history"
                   : steps.empty() ? "every move from the best candidate was tried already"
                                 : fmt::format("matching templates: {}", fmt::join(names, ", ")));
    return {};
  }

private:
  std::vector<template_ptr> templates_;

  std::string no_template_message(const graph_view& graph) const {
    std::map<std::string, int> prims;
    for (unsigned i = 0; i < graph.size(); ++i)
      prims[graph.primitive(static_cast<int>(i))]++;
    std::vector<std::string> parts;
    for (const auto& [p, n] : prims)
      parts.push_back(n > 1 ? fmt::format("{} x{}", p, n) : p);
    std::vector<std::string> names;
    for (const auto& t : templates_)
      names.push_back(t->name());
    return fmt::format("no template applies: the reference computes with {} and matches none of "
                       "the expert templates ({})",
                       fmt::join(parts, ", "), names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", ")));
  }
};

class expert_implementer final : public implementer_brain {
public:
  explicit expert_implementer(std::vector<template_ptr> t) : templates_(or_all(std::move(t))) {}
  std::string name() const override { return "expert"; }

  brain_status implement(schema::ImplementRequest::Reader req,
                         schema::ImplementReply::Builder out) override {
    config::chip chip;
    if (auto s = load_chip(req.getChip().cStr(), chip); !s.ok())
      return s;
    auto step = req.getStep();
    std::string tname = step.getTemplate().cStr();
    std::string parent_id;
    nlohmann::json params;
    if (step.getMove() != "template") {
      if (!req.getHasParent() || req.getParent().getTemplate().size() == 0)
        return brain_status::fail(error_code::bad_input,
                                  "move " + std::string(step.getMove().cStr()) +
                                    " needs a parent rendered from an expert template");
      tname = req.getParent().getTemplate().cStr();
      params = candidate_params(req.getParent());
      parent_id = req.getParent().getId().cStr();
    }
    template_ptr t;
    template_match m;
    if (auto s = rematch(templates_, tname, req.getAnalysis(), req.getSpec(), t, m); !s.ok())
      return s;
    if (step.getMove() == "template")
      params = t->initial_params(m, chip);
    auto changes = params_json(step.getChanges());
    for (const auto& [k, v] : changes.items())
      params[k] = v;
    if (std::string why; !check_param_types(*t, m, params, why))
      return brain_status::fail(error_code::bad_input, tname + ": " + why);
    if (!fit_vmem(*t, m, params, chip))
      return brain_status::fail(
        error_code::bad_input,
        fmt::format("{} with {} needs {:.1f} MiB of VMEM, more than {} has", tname,
                    params.dump(), t->vmem_bytes(m, params) / kMiB, chip.name));
    out.setSchemaVersion(schema::SCHEMA_VERSION);
    std::string strategy = step.getMove().cStr();
    if (!changes.empty())
      strategy += " " + changes.dump();
    return render_candidate(*t, m, params, parent_id, strategy, out.initCandidate());
  }

private:
  std::vector<template_ptr> templates_;
};

class expert_debugger final : public debugger_brain {
public:
  explicit expert_debugger(std::vector<template_ptr> t) : templates_(or_all(std::move(t))) {}
  std::string name() const override { return "expert"; }

  brain_status debug(schema::DebugRequest::Reader req, schema::DebugReply::Builder out) override {
    out.setSchemaVersion(schema::SCHEMA_VERSION);
    auto cand = req.getCandidate();
    if (req.getMaxAttempts() > 0 && req.getAttempt() > req.getMaxAttempts()) {
      out.setReason(fmt::format("gave up after {} attempts", req.getMaxAttempts()));
      return {};
    }
    if (cand.getTemplate().size() == 0) {
      out.setReason(failure_class(req.getResult()) + ": " +
                    "the kernel was not rendered from an expert template; no repair rule applies");
      return {};
    }
    config::chip chip;
    if (auto s = load_chip(req.getChip().cStr(), chip); !s.ok())
      return s;
    template_ptr t;
    template_match m;
    if (auto s = rematch(templates_, cand.getTemplate().cStr(), req.getAnalysis(), req.getSpec(),
                         t, m);
        !s.ok())
      return s;
    std::set<std::string> tried;
    for (auto f : req.getTried())
      tried.insert(f.cStr());
    auto r = repair_params(*t, m, candidate_params(cand), chip, req.getResult(), tried);
    out.setReason(r.reason);
    if (!r.repaired)
      return {};
    if (auto s = render_candidate(*t, m, r.params, cand.getId().cStr(), "repair: " + r.fix,
                                  out.initCandidate());
        !s.ok())
      return s;
    out.setRepaired(true);
    out.setFix(r.fix);
    return {};
  }

private:
  std::vector<template_ptr> templates_;
};

}  // namespace

planner_brain_ptr make_expert_planner(std::vector<template_ptr> templates) {
  return std::make_shared<expert_planner>(std::move(templates));
}
implementer_brain_ptr make_expert_implementer(std::vector<template_ptr> templates) {
  return std::make_shared<expert_implementer>(std::move(templates));
}
debugger_brain_ptr make_expert_debugger(std::vector<template_ptr> templates) {
  return std::make_shared<expert_debugger>(std::move(templates));
}

}  // namespace maxkernel::agents::expert
