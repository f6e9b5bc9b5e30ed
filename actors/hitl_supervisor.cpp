#include "actors/hitl_supervisor.hpp"

#include "actors/kernel_diff.hpp"
#include "actors/lineage.hpp"
#include "actors/supervisor_state.hpp"
#include "actors/supervisor_steps.hpp"
#include "maxkernel/schema/operator.capnp.h"
#include "messages/decision_kind.hpp"
#include "messages/source_candidate.hpp"

#include <caf/actor_system.hpp>
#include <caf/sec.hpp>

#include <chrono>
#include <cmath>

namespace maxkernel::actors {

namespace {

using messages::payload;
using schema::DecisionKind;

void iterate(supervisor_self self);
void propose(supervisor_self self, unsigned index);

int64_t now_unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// Appends one transcript entry (`fill` sets its union), written through; false after the
// search was aborted for it.
template <class Fill>
bool transcribe(supervisor_self self, unsigned seq, Fill fill) {
  capnp::MallocMessageBuilder msg;
  auto e = msg.initRoot<schema::TranscriptEntry>();
  e.setSeq(seq);
  e.setTimeUnixMs(now_unix_ms());
  fill(e);
  std::string error;
  if (!self->state.run->record.append_transcript(messages::encode(msg), error)) {
    abort_search(self, messages::make_error(messages::error_code::internal,
                                            "transcript: " + error));
    return false;
  }
  return true;
}

// An OperatorEvent to every attached shell.
template <class Fill>
void tell(supervisor_self self, Fill fill) {
  capnp::MallocMessageBuilder msg;
  auto e = msg.initRoot<schema::OperatorEvent>();
  e.setSchemaVersion(schema::SCHEMA_VERSION);
  fill(e);
  self->send(self->state.op, messages::notify_atom::value,
             messages::make_payload<schema::OperatorEvent>(msg));
}

void notice(supervisor_self self, const std::string& text) {
  report(self, text);
  tell(self, [&](schema::OperatorEvent::Builder e) { e.setNotice(text); });
}

// What the transcript says of the search so far: proposals made, and how many of the next
// proposals auto still decides (a hand-over's steps less the proposals auto has decided; a
// handed-over proposal the search was killed on is not counted as decided). Read from the
// transcript, not kept in the actor, so a resumed search goes on as it was.
struct transcript_state {
  unsigned proposals = 0;
  unsigned auto_steps = 0;
};

transcript_state read_transcript(const search_record& record) {
  transcript_state t;
  bool open_auto = false;  // the last entry is a handed-over proposal without its decision
  for (const auto& bytes : record.transcript()) {
    std::string error;
    auto m = messages::decode<schema::TranscriptEntry>(bytes, error);
    if (!m)
      continue;
    auto e = m->root<schema::TranscriptEntry>();
    if (e.isProposal()) {
      ++t.proposals;
      auto steps = e.getProposal().getAutoSteps();
      open_auto = steps > 0;
      if (steps > 0)
        t.auto_steps = steps - 1;
    } else if (e.isDecision()) {
      open_auto = false;
      if (e.getDecision().getKind() == DecisionKind::HAND_OVER)
        t.auto_steps = e.getDecision().getSteps();
    }
  }
  if (open_auto)
    ++t.auto_steps;
  return t;
}

unsigned proposals_made(const search_record& record) { return read_transcript(record).proposals; }

// A decision the supervisor takes itself (auto when handed over, the timeout policy).
messages::decoded_message own_decision(unsigned seq, DecisionKind kind, const std::string& who,
                                       const std::string& why) {
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::Decision>();
  d.setSchemaVersion(schema::SCHEMA_VERSION);
  d.setSeq(seq);
  d.setKind(kind);
  d.setOperator(who);
  d.setText(why);
  std::string error;
  auto decoded = messages::decode<schema::Decision>(messages::encode(msg), error);
  decoded->allow_rereading();
  return std::move(*decoded);
}

// The shells learn that the search ended (or could not go on), then the request is answered.
void end(supervisor_self self, const std::string& reason) {
  auto& record = self->state.run->record;
  int best = record.best();
  std::string text =
    best < 0 ? fmt::format("stopped: {}; no accepted correct kernel", reason)
             : fmt::format("stopped: {}; best vertex {} at {:.2f} us", reason, best,
                           record.vertex(static_cast<size_t>(best)).getTimeUs());
  if (!transcribe(self, proposals_made(record),
                  [&](schema::TranscriptEntry::Builder e) { e.setNote(text); }))
    return;
  tell(self, [&](schema::OperatorEvent::Builder e) { e.setEnded(text); });
  finish(self, reason);
}

void fail_search(supervisor_self self, caf::error err) {
  std::string text = "the search cannot go on: " + messages::message_of(err);
  tell(self, [&](schema::OperatorEvent::Builder e) { e.setEnded(text); });
  abort_search(self, std::move(err));
}

// Records vertex `index` again with the operator's decision on it.
bool set_decision(supervisor_self self, unsigned index, const char* decision,
                  const std::string& feedback) {
  capnp::MallocMessageBuilder msg;
  msg.setRoot(self->state.run->record.vertex(index));
  auto v = msg.getRoot<schema::Vertex>();
  v.setDecision(decision);
  v.setFeedback(feedback);
  return record_vertex(self, messages::encode(msg));
}

// Evaluates one candidate as the next vertex; the result is proposed.
void run_lineage(supervisor_self self, lineage_start start) {
  auto run = self->state.run;
  std::string what = fmt::format("vertex {} ({}): evaluating", start.index, start.strategy);
  auto l = std::make_shared<lineage<supervisor_impl>>(
    self, run->ctx, std::move(start), [self, run](std::string vertex, caf::error err) {
      if (!current(self, run))
        return;
      if (err)
        return fail_search(self, std::move(err));
      std::string error;
      auto v = messages::decode<schema::Vertex>(vertex, error);
      if (!v)
        return fail_search(self, messages::make_error(messages::error_code::internal,
                                                      "lineage vertex: " + error));
      capnp::MallocMessageBuilder msg;
      msg.setRoot(v->root<schema::Vertex>());
      msg.getRoot<schema::Vertex>().setDecision("awaiting");
      if (!record_vertex(self, messages::encode(msg)))
        return;
      ++self->state.round;
      propose(self, msg.getRoot<schema::Vertex>().getIndex());
    });
  // The bar of the tester's cases: the best (accepted) when the step starts.
  run->ctx->set_cases_bar(run->record.best_time_us());
  if (!record_vertex(self, l->pending_vertex()))
    return;
  report(self, what);
  l->run();
}

// An operator's decision that could not be carried out: the proposal is asked again.
void refuse(supervisor_self self, unsigned index, unsigned seq, const std::string& why) {
  std::string text = fmt::format("proposal #{}: {}; asked again", seq, why);
  if (!transcribe(self, seq, [&](schema::TranscriptEntry::Builder e) { e.setNote(text); }))
    return;
  notice(self, text);
  propose(self, index);
}

// A kernel the operator's decision made takes the proposal's place: the proposal is marked
// `decision` (not accepted) and the kernel is evaluated and proposed.
void adopt(supervisor_self self, unsigned index, unsigned seq, const std::string& candidate,
           const char* decision, int parent, std::string strategy, std::string rationale) {
  auto run = self->state.run;
  std::string error;
  auto c = messages::decode<schema::Candidate>(candidate, error);
  if (!c)
    return refuse(self, index, seq, "the kernel is not a candidate: " + error);
  std::string id = c->root<schema::Candidate>().getId().cStr();
  if (int known = run->record.find_candidate(id); known >= 0)
    return refuse(self, index, seq, fmt::format("that kernel is vertex {} already", known));
  if (!set_decision(self, index, decision, ""))
    return;
  run->step_ended();
  notice(self, fmt::format("proposal #{}: {}; evaluating vertex {}", seq, decision,
                           run->record.size()));
  run_lineage(self, {static_cast<unsigned>(run->record.size()), parent, self->state.round,
                     std::move(strategy), std::move(rationale), candidate});
}

// A candidate of the operator's own source.
std::string operator_candidate(const std::string& source, const std::string& parent_id,
                               const std::string& strategy, const std::string& who) {
  capnp::MallocMessageBuilder msg;
  messages::fill_source_candidate(msg.initRoot<schema::Candidate>(), source, parent_id, strategy,
                                  "operator:" + who);
  return messages::encode(msg);
}

// edit: parameters go through the implementer as a one-step plan (it re-renders the
// proposal's template with them, within the chip's VMEM); a source is taken as it is.
void edit(supervisor_self self, unsigned index, unsigned seq, schema::Decision::Reader d,
          const std::string& who) {
  auto run = self->state.run;
  auto v = run->record.vertex(index);
  if (d.getChanges().size() == 0) {
    if (d.getSource().size() == 0)
      return refuse(self, index, seq, "an edit needs parameters or a source");
    return adopt(self, index, seq,
                 operator_candidate(d.getSource().cStr(), v.getCandidate().getId().cStr(),
                                    "operator edit", who),
                 "edited", static_cast<int>(index), "operator edit",
                 "the operator's edit of vertex " + std::to_string(index));
  }
  // A one-step plan for the implementer, taken as every plan's steps are (a kernel already in
  // the graph is no new candidate).
  capnp::MallocMessageBuilder msg;
  auto plan = msg.initRoot<schema::Plan>();
  plan.setSchemaVersion(schema::SCHEMA_VERSION);
  auto step = plan.initSteps(1)[0];
  step.setMove("edit");
  step.setTemplate(v.getCandidate().getTemplate());
  step.setParentId(v.getCandidate().getId());
  step.setChanges(d.getChanges());
  step.setRationale("the operator's edit of vertex " + std::to_string(index));
  step.setBrain("operator");
  std::string error;
  auto decoded = messages::decode<schema::Plan>(messages::encode(msg), error);
  decoded->allow_rereading();
  auto impl = std::make_shared<step_implementer<supervisor_impl>>(
    self, run, std::make_shared<messages::decoded_message>(std::move(*decoded)),
    std::make_shared<std::vector<std::string>>(), 1,
    [self, run, index, seq](std::vector<implemented_step> found,
                            std::vector<std::string> skipped) {
      if (!current(self, run))
        return;
      if (found.empty())
        return refuse(self, index, seq,
                      "the edit cannot be made: " +
                        (skipped.empty() ? std::string("no kernel came of it") : skipped.front()));
      auto& f = found.front();
      adopt(self, index, seq, f.candidate, "edited", f.parent, f.strategy, f.rationale);
    });
  impl->start();
}

void decide(supervisor_self self, unsigned index, messages::decoded_message decision) {
  auto run = self->state.run;
  auto d = decision.root<schema::Decision>();
  unsigned seq = d.getSeq();
  if (!transcribe(self, seq, [&](schema::TranscriptEntry::Builder e) { e.setDecision(d); }))
    return;
  std::string who = d.getOperator().size() ? d.getOperator().cStr() : "the operator";
  std::string text = d.getText().cStr();
  report(self, fmt::format("proposal #{}: {} by {}", seq, messages::decision_kind_name(d.getKind()), who));
  switch (d.getKind()) {
    case DecisionKind::APPROVE:
      if (!set_decision(self, index, "approved", ""))
        return;
      break;
    case DecisionKind::HINT:
      if (!set_decision(self, index, "approved", text))
        return;
      break;
    case DecisionKind::HAND_OVER:  // the transcript holds the steps (read_transcript)
      if (!set_decision(self, index, "approved", ""))
        return;
      break;
    case DecisionKind::REJECT:
      if (!set_decision(self, index, "rejected", text))
        return;
      break;
    case DecisionKind::STOP:
      if (!set_decision(self, index, "stopped", text))
        return;
      return end(self, who == "policy" ? "timeout" : "operator");
    case DecisionKind::EDIT:
      return edit(self, index, seq, d, who);
    case DecisionKind::TAKE_OVER:
      if (d.getSource().size() == 0)
        return refuse(self, index, seq, "take over needs a kernel source");
      return adopt(self, index, seq, operator_candidate(d.getSource().cStr(), "", "operator kernel",
                                                        who),
                   "replaced", -1, "operator kernel", "the operator's own kernel");
  }
  run->step_ended();
  iterate(self);
}

void propose(supervisor_self self, unsigned index) {
  auto& st = self->state;
  auto run = st.run;
  auto ctx = run->ctx;
  auto& record = run->record;
  auto v = record.vertex(index);
  auto t = read_transcript(record);
  unsigned seq = t.proposals + 1;
  capnp::MallocMessageBuilder msg;
  auto p = msg.initRoot<schema::Proposal>();
  p.setSchemaVersion(schema::SCHEMA_VERSION);
  p.setSeq(seq);
  p.setTask(ctx->spec().getName());
  p.setChip(ctx->chip());
  bool measured = v.getHasResult() && v.getResult().getHasProfile() &&
                  v.getResult().getProfile().getTiming() == schema::Timing::MEASURED;
  p.setTiming(measured ? "measured" : "modeled");
  p.setVertex(v);
  p.setExpectedEffect(v.getExpectedEffect());
  std::string parent_source, parent_name = "(nothing)";
  if (v.getParent() >= 0) {
    auto parent = record.vertex(static_cast<size_t>(v.getParent()));
    parent_source = parent.getCandidate().getSource().cStr();
    parent_name = fmt::format("vertex {}", v.getParent());
    p.setParentTimeUs(parent.getTimeUs());
  }
  p.setDiff(unified_diff(parent_source, v.getCandidate().getSource().cStr(), parent_name,
                         fmt::format("vertex {}", index)));
  p.setBestIndex(record.best());
  p.setBestTimeUs(record.best_time_us());
  p.setReferenceTimeUs(ctx->optimize().getReferenceTimeUs());
  p.setEvaluations(record.evaluated());
  p.setBudgetEvals(run->budget_evals());
  p.setAutoSteps(t.auto_steps);
  if (!transcribe(self, seq, [&](schema::TranscriptEntry::Builder e) { e.setProposal(p); }))
    return;
  if (t.auto_steps > 0) {
    // Handed over: the shells see the proposal as a notice and auto approves it.
    tell(self, [&](schema::OperatorEvent::Builder e) { e.setProposal(p); });
    auto d = own_decision(seq, DecisionKind::APPROVE, "auto",
                          fmt::format("handed over ({} more)", t.auto_steps - 1));
    tell(self, [&](schema::OperatorEvent::Builder e) {
      e.setDecided(d.root<schema::Decision>());
    });
    return decide(self, index, std::move(d));
  }
  report(self, fmt::format("proposal #{}: vertex {} ({}) waits for the operator", seq, index,
                           v.getStrategy().cStr()));
  double seconds = ctx->settings().getOperatorTimeoutSeconds();
  std::string policy = ctx->settings().getOnTimeout().cStr();
  bool waits = seconds <= 0 || policy.empty() || policy == "wait";
  caf::duration timeout = waits ? caf::duration{caf::infinite}
                                : caf::duration{std::chrono::milliseconds(
                                    static_cast<int64_t>(std::llround(seconds * 1000)))};
  self->request(st.op, timeout, messages::propose_atom::value,
                messages::make_payload<schema::Proposal>(msg))
    .then(
      [self, run, index, seq](payload& reply) {
        if (!current(self, run))
          return;
        std::string error;
        auto d = messages::open_payload<schema::Decision>(reply, error);
        if (!d)
          return fail_search(self, messages::make_error(messages::error_code::malformed_message,
                                                        "Decision: " + error));
        d->allow_rereading();
        if (d->root<schema::Decision>().getSeq() != seq)
          return fail_search(self, messages::make_error(
                                     messages::error_code::malformed_message,
                                     fmt::format("a decision on proposal #{} came for #{}",
                                                 d->root<schema::Decision>().getSeq(), seq)));
        decide(self, index, std::move(*d));
      },
      [self, run, index, seq, seconds, policy](caf::error& err) {
        if (!current(self, run))
          return;
        if (err != caf::sec::request_timeout)
          return fail_search(self, std::move(err));
        auto d = own_decision(seq, policy == "stop" ? DecisionKind::STOP : DecisionKind::APPROVE,
                              "policy", fmt::format("no decision within {} s", seconds));
        // The gateway withdraws the proposal from the shells when it sees the decision.
        tell(self, [&](schema::OperatorEvent::Builder e) {
          e.setDecided(d.root<schema::Decision>());
        });
        decide(self, index, std::move(d));
      });
}

void iterate(supervisor_self self) {
  auto run = self->state.run;
  // A resumed search first finishes the candidate it was evaluating, then asks again for the
  // decision it was waiting on.
  for (size_t i = 0; i < run->record.size(); ++i)
    if (run->record.vertex(i).getState() == schema::VertexState::PENDING)
      return run_lineage(self, restart_of(run->record.vertex(i)));
  for (size_t i = 0; i < run->record.size(); ++i)
    if (run->record.vertex(i).getDecision() == "awaiting")
      return propose(self, static_cast<unsigned>(i));
  if (hold(self, [self] { iterate(self); }))
    return;
  if (auto reason = run->stop_reason(); !reason.empty())
    return end(self, reason);
  // As auto: the planner moves from the best accepted candidate (the operator's feedback and
  // hints in its guidance); the first step giving a new kernel is evaluated and proposed.
  next_in_chain(
    self, [self](lineage_start start) { run_lineage(self, std::move(start)); },
    [self](const std::string& text) { notice(self, text); }, [self] { end(self, "exhausted"); },
    [self](caf::error err) { fail_search(self, std::move(err)); });
}

}  // namespace

messages::supervisor_actor spawn_hitl_supervisor(caf::actor_system& sys,
                                                 messages::agent_pool pool,
                                                 messages::tpu_node_actor node,
                                                 messages::progress_listener_actor listener,
                                                 messages::operator_actor op) {
  return sys.spawn(
    [pool = std::move(pool), node = std::move(node), listener = std::move(listener),
     op = std::move(op)](supervisor_self self) mutable {
      self->state.op = op;
      return supervisor_behavior(self, std::move(pool), std::move(node), std::move(listener),
                                 std::function<void(supervisor_self)>(iterate));
    });
}

}  // namespace maxkernel::actors
