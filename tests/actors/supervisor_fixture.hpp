// The supervisors under CAF's deterministic scheduler: the real sub-agent pool (planner,
// implementer, debugger with the expert brains, tester, profiler) over a recorded analysis
// (tests/agents/expert/data/rmsnorm_3d.json, written by make_graphs.py from the real
// reference), and two stand-ins for what cannot be reached here:
// - the TPU node: answers each EvalRequest with an EvalResult (lowered, tested correct, a
//   modeled Profile whose time follows from the kernel's params, so that moves change it),
//   can fail chosen kernels at lowering (vmemOom) or in the tester's cases only (mismatch),
//   and hold its answers to release them in an
//   order the test picks; it counts what it was asked;
// - the operator (hitl): answers each Proposal with the next scripted Decision, or holds it;
//   records the Proposals and notices it got.
#pragma once

#include "maxkernel/schema/operator.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "messages/agent_pool.hpp"
#include "messages/capnp_io.hpp"
#include "messages/error.hpp"
#include "messages/operator_actor.hpp"
#include "messages/payload.hpp"
#include "messages/supervisor_actor.hpp"
#include "messages/tpu_node_actor.hpp"
#include "tests/support/deterministic_system.hpp"

#include <caf/typed_response_promise.hpp>
#include <gtest/gtest.h>

#include <capnp/message.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace maxkernel::actors_test {

using messages::payload;

// The rmsnorm_3d reference: its recorded analysis and a spec of the same inputs.
struct task {
  capnp::MallocMessageBuilder spec_msg, graph_msg;
  schema::KernelSpec::Reader spec() { return spec_msg.getRoot<schema::KernelSpec>().asReader(); }
  schema::DataflowGraph::Reader analysis() {
    return graph_msg.getRoot<schema::DataflowGraph>().asReader();
  }
};
std::shared_ptr<task> rmsnorm_task();
// matmul_bias_gelu_softmax (512x1024 @ 1024x2048): a template with several blocks.
std::shared_ptr<task> matmul_task();

// ---- the stand-in TPU node ----------------------------------------------------------------

enum class answer_order { at_once, forward, reversed };

struct node_book {
  unsigned requests = 0;               // evaluation requests received
  std::vector<std::string> sources;    // the source of each, in arrival order
  std::set<std::string> failing;       // kernels answered with a lowering failure
  schema::ErrorClass failing_class = schema::ErrorClass::VMEM_OOM;  // ... of this class
  bool fail_first = false;             // the first kernel it is asked about joins `failing`
  std::set<std::string> failing_cases; // kernels that pass the node's test but fail the
                                       // tester's cases (mismatch)
  std::vector<std::string> case_sources;  // the source of each tester case (a request with
                                          // seeds), in arrival order
  std::multiset<std::string> scopes;   // EvalOptions.storeScope of each request
  answer_order order = answer_order::at_once;  // forward/reversed: held until released
  std::map<unsigned, messages::error_code> errors;  // request n (from 1) answered with an error
  std::vector<std::pair<caf::typed_response_promise<payload>, payload>> held;
  size_t max_held = 0;                 // the most answers released at once
  double best_block = 128;             // the block size its times are lowest at (each
                                       // halving or doubling away costs the same)
  bool structure = false;              // answers carry a KernelStructure built from
                                       // kernel_params: a change of anything else (a string
                                       // choice, the VMEM limit) makes the same kernel

  std::set<std::string> distinct() const { return {sources.begin(), sources.end()}; }
  // The sources of the requests it holds answers for (the last ones it received).
  std::set<std::string> held_sources() const {
    return {sources.end() - static_cast<std::ptrdiff_t>(held.size()), sources.end()};
  }
};

// The modeled time of a kernel: from the `# params:` header of an expert template's source
// (each block parameter away from `best_block` costs time), else from the source's length.
double modeled_time_us(const std::string& source, double best_block = 128);
// What that time depends on: the numeric params of the header but vmem_limit_bytes (a JSON
// object dump; the source itself when it has no header).
std::string kernel_params(const std::string& source);
constexpr double roofline_us = 4.0;

using release_atom = caf::atom_constant<caf::atom("release")>;
// The node's interface plus `release`: the held answers go out in the book's order.
using stand_in_node = messages::tpu_node_actor::extend<caf::reacts_to<release_atom>>;
stand_in_node spawn_stand_in_node(caf::actor_system& sys, std::shared_ptr<node_book> book);

// ---- the scripted operator ----------------------------------------------------------------

struct scripted_decision {
  schema::DecisionKind kind = schema::DecisionKind::APPROVE;
  std::string text;
  std::vector<std::pair<std::string, std::string>> changes;  // parameter -> JSON literal
  std::string source;
  uint32_t steps = 0;
  bool hold = false;  // no answer: the proposal waits
  int seq_offset = 0;  // answers proposal seq + seq_offset (a confused shell)
  std::string who = "ana";
};

inline scripted_decision approve() { return {}; }
inline scripted_decision hold() {
  scripted_decision d;
  d.hold = true;
  return d;
}
inline scripted_decision decision(schema::DecisionKind kind, std::string text = {}) {
  scripted_decision d;
  d.kind = kind;
  d.text = std::move(text);
  return d;
}

struct operator_book {
  std::deque<scripted_decision> script;           // empty: every proposal is held
  std::vector<messages::decoded_message> proposals;  // Proposal, as asked
  std::vector<messages::decoded_message> events;     // OperatorEvent, as notified
  std::vector<caf::typed_response_promise<payload>> held;

  schema::Proposal::Reader proposal(size_t i) {
    return proposals.at(i).root<schema::Proposal>();
  }
  schema::OperatorEvent::Reader event(size_t i) { return events.at(i).root<schema::OperatorEvent>(); }
  std::vector<std::string> notices();
  // Proposals that came as notices (handed over to auto), and the `decided` events.
  std::vector<unsigned> noticed_proposals();
  std::vector<std::string> decided_by();
};

messages::operator_actor spawn_scripted_operator(caf::actor_system& sys,
                                                 std::shared_ptr<operator_book> book);

// ---- a planner spy: the real planner, with the guidance of each request kept ---------------

messages::planner_actor spawn_planner_spy(
  caf::actor_system& sys, messages::planner_actor real,
  std::shared_ptr<std::vector<std::vector<std::string>>> guidance);

// ---- the fixture ---------------------------------------------------------------------------

struct search_settings {
  std::string mode = "auto";
  std::string task = "rmsnorm";    // rmsnorm | matmul
  unsigned budget = 4;
  unsigned beam = 2, branching = 2;
  std::string policy = "beam";
  unsigned max_repairs = 2;
  double operator_timeout_s = 0;
  std::string on_timeout{};
  uint64_t seed = 7;
  std::string graph_path{};
  bool resume = false;
  bool dive = true;
  bool test_every_candidate = false;
  std::string store_scope{};
  std::string chip = "v6e";
};

struct outcome {
  bool answered = false;
  std::optional<messages::decoded_message> result;  // OptimizeResult
  caf::error error;
  schema::OptimizeResult::Reader r() { return result->root<schema::OptimizeResult>(); }
};

class supervisor_fixture : public ::testing::Test {
protected:
  void SetUp() override;
  void TearDown() override;

  payload optimize_request(const search_settings& s);
  // Sends the OptimizeRequest; drive() runs everything (releasing the node's held answers)
  // until no actor has anything left to do; answer() takes the supervisor's answer, if any.
  void start(const messages::supervisor_actor& sup, const search_settings& s);
  void drive();
  outcome answer();
  outcome optimize(const messages::supervisor_actor& sup, const search_settings& s) {
    start(sup, s);
    drive();
    return answer();
  }
  // Replaces the pool's planner with a spy around it (the guidance of every PlannerRequest).
  std::shared_ptr<std::vector<std::vector<std::string>>> spy_on_planner();

  test_support::deterministic_system env;
  std::shared_ptr<node_book> node = std::make_shared<node_book>();
  std::shared_ptr<operator_book> op = std::make_shared<operator_book>();
  messages::agent_pool pool;
  stand_in_node node_actor;
  messages::operator_actor operator_actor;
  std::vector<caf::actor> to_stop;
};

// The best correct time (accepted: no hitl decision, or approved) among vertices 0..k-1; 0
// when none: the bar of the tester's cases for a step whose first vertex is k.
double best_time_before(schema::OptimizeResult::Reader r, unsigned k);

// The tester's cases went to a correct vertex exactly when its time was faster than its
// step's bar (bars[k]; 0: none, every case): the others are correct on the node's test alone,
// took one evaluation, say so in their verdict and were never sent as a case; the best is
// never one of them. Returns how many vertices skipped the cases.
unsigned expect_cases_only_when_faster(schema::OptimizeResult::Reader r,
                                       const std::vector<double>& bars, const node_book& book);

// The vertices of a result, each as its bytes (for comparing two searches whole).
std::vector<std::string> vertex_bytes(schema::OptimizeResult::Reader r);
std::vector<messages::decoded_message> transcript(schema::OptimizeResult::Reader r);

}  // namespace maxkernel::actors_test
