// One candidate's way through the pool, shared by every supervisor: the node evaluates it
// (lower, test, profile), the tester's cases run on whatever nodes are free, the tester
// judges, a failure goes to the debugger (up to maxRepairs fixes, never one twice) and the
// repaired candidate starts over; a correct one goes to the profiler. The end is one Vertex.
// The tester's cases cost several interpret-mode runs each, so they go only to a candidate
// that could become the result: one faster than the step's bar (search_context::
// cases_bar_us); a slower one is correct on the node's test alone (Vertex.casesSkipped).
// Every step is an asynchronous request of the supervisor actor (it never blocks), so many
// lineages of a graph round run at once. Included only by the supervisors' .cpp files.
#pragma once

#include "actors/search_context.hpp"
#include "messages/error.hpp"
#include "messages/eval_failure.hpp"
#include "messages/eval_request.hpp"
#include "messages/payload_codec.hpp"

#include <caf/error.hpp>
#include <fmt/format.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace maxkernel::actors {

// Where a lineage starts: the vertex it becomes and the candidate it tries first.
struct lineage_start {
  unsigned index = 0;
  int parent = -1;
  unsigned round = 0;
  std::string strategy;
  std::string rationale;
  std::string candidate;  // Candidate bytes
  std::string expected_effect = {};
};

// The Vertex bytes, or an error of the infrastructure (a node or role that cannot answer):
// the search cannot go on.
using lineage_done = std::function<void(std::string vertex, caf::error error)>;

template <class Self>
class lineage : public std::enable_shared_from_this<lineage<Self>> {
public:
  lineage(Self* self, std::shared_ptr<search_context> ctx, lineage_start start,
          lineage_done done)
    : self_(self), ctx_(std::move(ctx)), start_(std::move(start)), done_(std::move(done)) {}

  // The vertex as it stands before evaluation (state pending), for the graph file.
  std::string pending_vertex() {
    capnp::MallocMessageBuilder msg;
    auto v = msg.initRoot<schema::Vertex>();
    fill_identity(v);
    v.setState(schema::VertexState::PENDING);
    std::string error;
    if (auto c = messages::decode<schema::Candidate>(start_.candidate, error))
      v.setCandidate(c->root<schema::Candidate>());
    return messages::encode(msg);
  }

  void run() {
    std::string error;
    candidate_ = messages::decode<schema::Candidate>(start_.candidate, error);
    if (!candidate_)
      return fail_hard(messages::make_error(messages::error_code::internal,
                                            "lineage: candidate: " + error));
    candidate_->allow_rereading();
    evaluate_default();
  }

private:
  using payload = messages::payload;

  schema::Candidate::Reader candidate() { return candidate_->root<schema::Candidate>(); }

  payload eval_request(std::optional<schema::EvalOptions::Reader> options) {
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::EvalRequest>();
    messages::request_settings settings;
    settings.chip = ctx_->chip();
    settings.candidate_id = candidate().getId().cStr();
    settings.store_scope = ctx_->store_scope();
    messages::build_eval_request(req, ctx_->spec(), candidate().getSource().cStr(),
                                 candidate().getOrigin().cStr(), settings);
    if (options) {
      req.setOptions(*options);
      req.getOptions().setChip(ctx_->chip());
      req.getOptions().setStoreScope(settings.store_scope);
    }
    return messages::make_payload<schema::EvalRequest>(msg);
  }

  // One evaluation request; a deadline that passed is the candidate's failure (class
  // timeout), any other error stops the search.
  template <class OnResult>
  void evaluate(payload request, OnResult on_result) {
    auto me = this->shared_from_this();
    ++ctx_->in_flight;
    ++evaluations_;
    self_->request(ctx_->node, ctx_->eval_timeout(), messages::evaluate_atom::value,
                   std::move(request), ctx_->deadline_ms())
      .then(
        [me, on_result](payload& reply) mutable {
          --me->ctx_->in_flight;
          if (me->dead_)
            return;
          std::string error;
          auto msg = messages::open_payload<schema::EvalResult>(reply, error);
          if (!msg)
            return me->fail_hard(messages::make_error(messages::error_code::malformed_message,
                                                      "EvalResult: " + error));
          msg->allow_rereading();
          if (msg->template root<schema::EvalResult>().getCached())
            ++me->cache_hits_;
          on_result(std::move(*msg));
        },
        [me, on_result](caf::error& err) mutable {
          --me->ctx_->in_flight;
          if (me->dead_)
            return;
          if (messages::code_of(err) != messages::error_code::worker_timeout)
            return me->fail_hard(std::move(err));
          on_result(timeout_result(messages::message_of(err)));
        });
  }

  static messages::decoded_message timeout_result(const std::string& why) {
    std::string error;
    auto decoded = messages::decode<schema::EvalResult>(messages::timeout_result(why), error);
    decoded->allow_rereading();
    return std::move(*decoded);
  }

  void evaluate_default() {
    auto me = this->shared_from_this();
    evaluate(eval_request(std::nullopt), [me](messages::decoded_message result) {
      me->result_ = std::move(result);
      auto r = me->result_->template root<schema::EvalResult>();
      if (!r.getCorrect())
        return me->failed(r, "");
      me->cases_skipped_ = false;
      if (auto why = me->cases_skipped_because(r); !why.empty()) {
        me->cases_skipped_ = true;
        return me->diagnose(why);
      }
      me->run_cases();
    });
  }

  // Why the tester's cases are not needed for a candidate that passed the node's test, or ""
  // when they are: its time is not faster than the bar, so it cannot become the best (a tie
  // goes to the earlier vertex, which holds the bar). A candidate without a time is tested
  // in full (it cannot be compared).
  std::string cases_skipped_because(schema::EvalResult::Reader r) {
    double bar = ctx_->cases_bar_us;
    if (!(bar > 0) || !r.getHasProfile())
      return "";
    double t = r.getProfile().getTimeUs();
    if (!(t > 0) || t < bar)
      return "";
    const char* timing =
      r.getProfile().getTiming() == schema::Timing::MEASURED ? "measured" : "modeled";
    return fmt::format("correct on the node's test; the tester's cases skipped: {:.2f} us "
                       "({}) is not faster than the best {:.2f} us when its step started",
                       t, timing, bar);
  }

  // The tester's cases, all sent at once; the verdict reads them in case order.
  void run_cases() {
    auto plan = ctx_->test_plan();
    auto cases = plan.getCases();
    if (cases.size() == 0)
      return diagnose("the node's test passed (the tester chose no cases)");
    case_results_.clear();
    case_results_.resize(cases.size());
    pending_cases_ = cases.size();
    auto me = this->shared_from_this();
    for (unsigned i = 0; i < cases.size(); ++i) {
      evaluate(eval_request(cases[i].getOptions()), [me, i](messages::decoded_message result) {
        me->case_results_[i] = std::move(result);
        if (--me->pending_cases_ == 0)
          me->judge();
      });
    }
  }

  void judge() {
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::JudgeRequest>();
    req.setSchemaVersion(schema::SCHEMA_VERSION);
    req.setSpec(ctx_->spec());
    req.setPlan(ctx_->test_plan());
    auto results = req.initResults(static_cast<unsigned>(case_results_.size()));
    for (unsigned i = 0; i < case_results_.size(); ++i)
      results.setWithCaveats(i, case_results_[i]->template root<schema::EvalResult>());
    auto me = this->shared_from_this();
    self_->request(ctx_->pool.tester, ctx_->role_timeout(), messages::judge_atom::value,
                   messages::make_payload<schema::JudgeRequest>(msg))
      .then(
        [me](payload& reply) {
          std::string error;
          auto v = messages::open_payload<schema::Verdict>(reply, error);
          if (!v)
            return me->fail_hard(messages::make_error(messages::error_code::malformed_message,
                                                      "Verdict: " + error));
          auto verdict = v->template root<schema::Verdict>();
          me->verdict_ = verdict.getSummary().cStr();
          if (verdict.getCorrect())
            return me->diagnose(me->verdict_);
          int at = std::max(0, verdict.getFailedCase());
          auto& failed = me->case_results_[static_cast<size_t>(at)];
          me->failed(failed->template root<schema::EvalResult>(), me->verdict_);
        },
        [me](caf::error& err) { me->fail_hard(std::move(err)); });
  }

  void failed(schema::EvalResult::Reader result, const std::string& verdict) {
    failures_.push_back(messages::failure_class(result));
    last_failure_ = failures_.back();
    std::string why = messages::failure_message(result);
    verdict_ = why.empty() ? verdict : why.substr(0, why.find('\n'));
    if (attempt_ >= ctx_->settings().getMaxRepairs())
      return finish(false);
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::DebugRequest>();
    req.setSchemaVersion(schema::SCHEMA_VERSION);
    req.setSpec(ctx_->spec());
    req.setAnalysis(ctx_->analysis());
    req.setCandidate(candidate());
    req.setResult(result);
    req.setAttempt(attempt_ + 1);
    req.setMaxAttempts(ctx_->settings().getMaxRepairs());
    req.setChip(ctx_->chip());
    auto tried = req.initTried(static_cast<unsigned>(tried_.size()));
    for (unsigned i = 0; i < tried_.size(); ++i)
      tried.set(i, tried_[i]);
    auto me = this->shared_from_this();
    self_->request(ctx_->pool.debugger, ctx_->role_timeout(), messages::debug_atom::value,
                   messages::make_payload<schema::DebugRequest>(msg))
      .then(
        [me](payload& reply) {
          std::string error;
          auto d = messages::open_payload<schema::DebugReply>(reply, error);
          if (!d)
            return me->fail_hard(messages::make_error(messages::error_code::malformed_message,
                                                      "DebugReply: " + error));
          auto rep = d->template root<schema::DebugReply>();
          me->ctx_->usage(rep.getUsage());
          if (!rep.getRepaired()) {
            me->verdict_ += fmt::format("; the debugger gives up: {}", rep.getReason().cStr());
            return me->finish(false);
          }
          ++me->attempt_;
          me->tried_.push_back(rep.getFix().cStr());
          me->tried_ids_.push_back(me->candidate().getId().cStr());
          std::string err2;
          me->candidate_ = messages::decode<schema::Candidate>(
            messages::encode_root(rep.getCandidate()), err2);
          me->candidate_->allow_rereading();
          me->evaluate_default();
        },
        // A debugger that cannot answer (an LLM out of reach) ends the lineage, not the search.
        [me](caf::error& err) {
          me->verdict_ += "; debugger: " + messages::message_of(err);
          me->finish(false);
        });
  }

  void diagnose(const std::string& verdict) {
    verdict_ = verdict;
    auto r = result_->template root<schema::EvalResult>();
    if (!r.getHasProfile())
      return finish(true);
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::ProfilerRequest>();
    req.setSchemaVersion(schema::SCHEMA_VERSION);
    req.setProfile(r.getProfile());
    req.setHasStructure(r.getHasStructure());
    if (r.getHasStructure())
      req.setStructure(r.getStructure());
    req.setChip(ctx_->chip());
    auto me = this->shared_from_this();
    self_->request(ctx_->pool.profiler, ctx_->role_timeout(), messages::diagnose_atom::value,
                   messages::make_payload<schema::ProfilerRequest>(msg))
      .then(
        [me](payload& reply) {
          std::string error;
          me->diagnosis_ = messages::open_payload<schema::Diagnosis>(reply, error);
          me->finish(true);
        },
        [me](caf::error&) { me->finish(true); });
  }

  void fill_identity(schema::Vertex::Builder v) {
    v.setIndex(start_.index);
    v.setParent(start_.parent);
    v.setStrategy(start_.strategy);
    v.setRound(start_.round);
    v.setRationale(start_.rationale);
    v.setExpectedEffect(start_.expected_effect);
  }

  void finish(bool correct) {
    capnp::MallocMessageBuilder msg;
    auto v = msg.initRoot<schema::Vertex>();
    fill_identity(v);
    v.setState(correct ? schema::VertexState::EVALUATED : schema::VertexState::FAILED);
    v.setCandidate(candidate());
    if (result_) {
      auto r = result_->template root<schema::EvalResult>();
      v.setResult(r);
      v.setHasResult(true);
      if (r.getHasProfile()) {
        v.setTimeUs(r.getProfile().getTimeUs());
        v.setRooflineUs(r.getProfile().getRooflineUs());
      }
    }
    v.setCorrect(correct);
    v.setCasesSkipped(correct && cases_skipped_);
    v.setVerdict(verdict_);
    v.setFailureClass(correct ? "" : last_failure_);
    if (diagnosis_) {
      v.setDiagnosis(diagnosis_->template root<schema::Diagnosis>());
      v.setHasDiagnosis(true);
    }
    v.setRepairs(attempt_);
    v.setEvaluations(evaluations_);
    v.setCacheHits(cache_hits_);
    auto f = v.initAttemptFailures(static_cast<unsigned>(failures_.size()));
    for (unsigned i = 0; i < failures_.size(); ++i)
      f.set(i, failures_[i]);
    auto ids = v.initTriedIds(static_cast<unsigned>(tried_ids_.size()));
    for (unsigned i = 0; i < tried_ids_.size(); ++i)
      ids.set(i, tried_ids_[i]);
    finished(messages::encode(msg), caf::error{});
  }

  void fail_hard(caf::error err) {
    dead_ = true;  // answers still out (other test cases) are dropped
    finished({}, std::move(err));
  }

  void finished(std::string vertex, caf::error err) {
    if (!done_)
      return;  // an answer after the lineage ended (cannot happen; guards a double call)
    auto done = std::move(done_);
    done_ = nullptr;
    done(std::move(vertex), std::move(err));
  }

  Self* self_;
  std::shared_ptr<search_context> ctx_;
  lineage_start start_;
  lineage_done done_;
  std::optional<messages::decoded_message> candidate_;
  std::optional<messages::decoded_message> result_;     // the default evaluation
  std::optional<messages::decoded_message> diagnosis_;
  std::vector<std::optional<messages::decoded_message>> case_results_;
  size_t pending_cases_ = 0;
  bool dead_ = false;
  bool cases_skipped_ = false;  // the last candidate passed the node's test, cases not run
  unsigned attempt_ = 0, evaluations_ = 0, cache_hits_ = 0;
  std::vector<std::string> tried_, failures_;
  std::vector<std::string> tried_ids_;  // candidates replaced by a repair, in order
  std::string verdict_, last_failure_;
};

}  // namespace maxkernel::actors
