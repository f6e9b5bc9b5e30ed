// The dispatcher's protocol under CAF's deterministic scheduler: the test decides when
// actors run and moves the clock. The nodes are stand-in devices defined here: no TPU can be
// reached on this machine, and the protocol cases (a device that is slow, refuses, freezes or
// fails) are exactly what a real device does not do on demand. They speak
// messages::tpu_node_actor and answer an EvalResult naming themselves (in `key`) and the
// candidate they were asked about. tests/cluster/dispatcher_nodes_test.cpp runs the
// dispatcher in front of real tpu_nodes.
#include "cluster/dispatcher.hpp"
#include "maxkernel/schema/cluster.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "tests/support/deterministic_system.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/stateful_actor.hpp>
#include <gtest/gtest.h>

#include <capnp/message.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace maxkernel;
using namespace std::chrono_literals;
using messages::error_code;
using messages::payload;
using std::chrono::milliseconds;

namespace {

using answer_atom = caf::atom_constant<caf::atom("answer")>;

// What the stand-in devices of one test saw, in arrival order over all of them.
struct device_book {
  struct entry {
    std::string device;
    std::string candidate;
    uint32_t deadline_ms = 0;
  };
  std::vector<entry> received;
  std::map<std::string, unsigned> busy;      // evaluations held now
  std::map<std::string, unsigned> max_busy;  // the most held at once
  std::map<std::string, unsigned> analyses;  // analyze requests received

  std::vector<std::string> candidates_at(const std::string& device) const {
    std::vector<std::string> out;
    for (auto& e : received)
      if (e.device == device)
        out.push_back(e.candidate);
    return out;
  }
};

struct device_setup {
  device_setup() = default;
  device_setup(std::string n, milliseconds d = 1s) : name(std::move(n)), delay(d) {}
  device_setup& refusing(std::vector<unsigned> which) {
    refuse = std::move(which);
    return *this;
  }
  device_setup& frozen() {
    silent = true;
    return *this;
  }
  device_setup& failing(error_code code) {
    fail = code;
    return *this;
  }
  device_setup& taking(const std::string& candidate, milliseconds d) {
    delay_for[candidate] = d;
    return *this;
  }
  device_setup& crashing_analyses(unsigned n) {
    analyze_crashes = n;
    return *this;
  }
  device_setup& silent_analyses() {
    mute_analyses = true;
    return *this;
  }

  std::string name;
  milliseconds delay{1'000};            // an evaluation takes this long
  std::vector<unsigned> refuse;         // these evaluations (1: its first) are refused
  bool silent = false;                  // never answers an evaluation (a frozen host)
  error_code fail = error_code::none;   // answers every evaluation with this error
  std::map<std::string, milliseconds> delay_for;  // candidates that take longer (or shorter)
  unsigned analyze_crashes = 0;         // its worker dies under this many analyze requests
  bool mute_analyses = false;           // holds every analyze request, answering none
};

struct device_state {
  device_setup setup;
  std::shared_ptr<device_book> book;
  std::map<uint64_t, std::pair<caf::response_promise, std::string>> held;
  uint64_t next = 1;
  unsigned evaluations = 0;
  std::vector<caf::response_promise> unanswered;  // analyses it holds (silent_analyses)
};

std::string candidate_of(const payload& request) {
  std::string err;
  auto msg = messages::open_payload<schema::EvalRequest>(request, err);
  EXPECT_TRUE(msg) << err;
  return msg ? std::string(msg->root<schema::EvalRequest>().getCandidate().getId()) : "";
}

payload result_for(const std::string& device, const std::string& candidate) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::EvalResult>();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  r.setCandidateId(candidate);
  r.setKey(device);  // which device answered
  r.setBackend("stand-in");
  r.setCorrect(true);
  return messages::make_payload<schema::EvalResult>(msg);
}

caf::behavior standin_device(caf::stateful_actor<device_state>* self, device_setup setup,
                             std::shared_ptr<device_book> book) {
  self->state.setup = std::move(setup);
  self->state.book = std::move(book);
  auto evaluate = [self](payload& request, uint32_t deadline_ms) {
    auto& st = self->state;
    auto& name = st.setup.name;
    auto candidate = candidate_of(request);
    st.book->received.push_back({name, candidate, deadline_ms});
    auto rp = self->make_response_promise();
    auto n = ++st.evaluations;
    if (std::find(st.setup.refuse.begin(), st.setup.refuse.end(), n) != st.setup.refuse.end()) {
      rp.deliver(messages::make_error(error_code::overloaded, name + " is full"));
      return rp;
    }
    if (st.setup.fail != error_code::none) {
      rp.deliver(messages::make_error(st.setup.fail, name + " failed " + candidate));
      return rp;
    }
    auto& busy = ++st.book->busy[name];
    st.book->max_busy[name] = std::max(st.book->max_busy[name], busy);
    auto id = st.next++;
    st.held.emplace(id, std::make_pair(rp, candidate));
    auto slow = st.setup.delay_for.find(candidate);
    auto delay = slow != st.setup.delay_for.end() ? slow->second : st.setup.delay;
    if (!st.setup.silent)
      self->delayed_send(self, delay, answer_atom::value, id);
    return rp;
  };
  return {
    [evaluate](messages::evaluate_atom, payload& request) { return evaluate(request, 0); },
    [evaluate](messages::evaluate_atom, payload& request, uint32_t deadline_ms) {
      return evaluate(request, deadline_ms);
    },
    [self](answer_atom, uint64_t id) {
      auto& st = self->state;
      auto it = st.held.find(id);
      --st.book->busy[st.setup.name];
      it->second.first.deliver(result_for(st.setup.name, it->second.second));
      st.held.erase(it);
    },
    [self](messages::load_atom, std::string& path) {
      capnp::MallocMessageBuilder msg;
      auto spec = msg.initRoot<schema::KernelSpec>();
      spec.setSchemaVersion(schema::SCHEMA_VERSION);
      spec.setName(self->state.setup.name + ":" + path);
      return messages::make_payload<schema::KernelSpec>(msg);
    },
    [self](messages::load_atom, payload& request) {
      // A load with the task's files: names the path and how many files came.
      std::string err;
      auto load = messages::open_payload<schema::LoadRequest>(request, err);
      capnp::MallocMessageBuilder msg;
      auto spec = msg.initRoot<schema::KernelSpec>();
      spec.setSchemaVersion(schema::SCHEMA_VERSION);
      spec.setName(self->state.setup.name + ":" + (load ? load->root<schema::LoadRequest>().getPath().cStr() : "?")
                   + ":" + std::to_string(load ? load->root<schema::LoadRequest>().getTaskFiles().size() : 0));
      return messages::make_payload<schema::KernelSpec>(msg);
    },
    [self](messages::analyze_atom, payload&) -> caf::result<payload> {
      auto& st = self->state;
      ++st.book->analyses[st.setup.name];
      if (st.setup.mute_analyses) {
        st.unanswered.push_back(self->make_response_promise());
        return st.unanswered.back();
      }
      if (st.setup.analyze_crashes > 0) {
        --st.setup.analyze_crashes;
        return messages::make_error(error_code::worker_crashed, st.setup.name + ": the worker died");
      }
      capnp::MallocMessageBuilder msg;
      auto spec = msg.initRoot<schema::KernelSpec>();
      spec.setSchemaVersion(schema::SCHEMA_VERSION);
      spec.setName(self->state.setup.name);
      return messages::make_payload<schema::KernelSpec>(msg);
    },
    [self](messages::info_atom) {
      capnp::MallocMessageBuilder msg;
      auto info = msg.initRoot<schema::NodeInfo>();
      info.setSchemaVersion(schema::SCHEMA_VERSION);
      info.setNodeId(self->state.setup.name);
      return messages::make_payload<schema::NodeInfo>(msg);
    },
  };
}

payload eval_request(const std::string& candidate, const std::string& chip = "") {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::EvalRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  auto spec = req.initSpec();
  spec.setName("spec");
  spec.setChip(chip);
  auto c = req.initCandidate();
  c.setId(candidate);
  c.setSource("def workload(x):\n    return x  # " + candidate + "\n");
  return messages::make_payload<schema::EvalRequest>(msg);
}

struct reply {
  std::string candidate;  // of the EvalResult
  std::string device;     // that answered it
  caf::error error;
};

struct status_view {
  std::optional<messages::decoded_message> msg;
  schema::DispatcherStatus::Reader root() { return msg->root<schema::DispatcherStatus>(); }
  schema::NodeLoad::Reader node(unsigned i) { return root().getNodes()[i]; }
};

class Dispatcher : public ::testing::Test {
protected:
  Dispatcher() : book(std::make_shared<device_book>()) {}

  ~Dispatcher() override {
    for (auto& a : spawned)
      env.self->send_exit(a, caf::exit_reason::user_shutdown);
    env.run_messages();
  }

  messages::tpu_node_actor device(device_setup setup) {
    auto d = env.sys.spawn(standin_device, std::move(setup), book);
    spawned.push_back(d);
    return caf::actor_cast<messages::tpu_node_actor>(d);
  }

  messages::dispatcher_actor dispatcher(std::vector<messages::tpu_node_actor> nodes,
                                        cluster::dispatcher_config cfg = config()) {
    auto d = cluster::spawn_dispatcher(env.sys, std::move(nodes), cfg);
    spawned.push_back(caf::actor_cast<caf::actor>(d));
    env.run_messages();  // it asks each node to describe itself
    return d;
  }

  static cluster::dispatcher_config config() {
    cluster::dispatcher_config cfg;
    cfg.straggler_min = 2s;
    cfg.straggler_factor = 2.0;
    cfg.reply_margin = 1s;
    cfg.default_deadline = 100s;
    cfg.overload_retry = 5s;
    return cfg;
  }

  void evaluate(const messages::dispatcher_actor& d, const std::string& candidate,
                uint32_t deadline_ms = 0) {
    if (deadline_ms > 0)
      env.self->send(d, messages::evaluate_atom::value, eval_request(candidate), deadline_ms);
    else
      env.self->send(d, messages::evaluate_atom::value, eval_request(candidate));
  }

  // Every answer that reached the requester so far, in arrival order.
  std::vector<reply> replies() {
    std::vector<reply> out;
    for (;;) {
      reply r;
      bool got = env.receive_now(
        [&](payload& p) {
          std::string err;
          auto msg = messages::open_payload<schema::EvalResult>(p, err);
          ASSERT_TRUE(msg) << err;
          r.candidate = msg->root<schema::EvalResult>().getCandidateId();
          r.device = msg->root<schema::EvalResult>().getKey();
        },
        [&](caf::error& e) { r.error = std::move(e); });
      if (!got)
        return out;
      out.push_back(std::move(r));
    }
  }

  // Moves the clock by `d` and runs everything that became due.
  void elapse(caf::timespan d) {
    env.advance_time(d);
    env.run_messages();
  }

  status_view status(const messages::dispatcher_actor& d) {
    env.self->send(d, messages::status_atom::value);
    env.run_messages();
    status_view s;
    bool got = env.receive_now([&](payload& p) {
      std::string err;
      s.msg = messages::open_payload<schema::DispatcherStatus>(p, err);
      EXPECT_TRUE(s.msg) << err;
    });
    EXPECT_TRUE(got && s.msg);
    return s;
  }

  // The answer to an analyze that reached the requester: the KernelSpec's name (the node
  // that answered), "error: ..." for an error, "" for none yet.
  std::string analysis_answer() {
    std::string out;
    env.receive_now(
      [&](payload& p) {
        std::string err;
        auto msg = messages::open_payload<schema::KernelSpec>(p, err);
        EXPECT_TRUE(msg) << err;
        if (msg)
          out = msg->root<schema::KernelSpec>().getName();
      },
      [&](caf::error& e) { out = "error: " + messages::message_of(e); });
    return out;
  }

  void kill(const messages::tpu_node_actor& node) {
    env.self->send_exit(node, caf::exit_reason::kill);
    env.run_messages();
  }

  test_support::deterministic_system env;
  std::shared_ptr<device_book> book;
  std::vector<caf::actor> spawned;
};

std::vector<std::string> names(const std::vector<reply>& rs) {
  std::vector<std::string> out;
  for (auto& r : rs)
    out.push_back(r.candidate);
  return out;
}

using strings = std::vector<std::string>;

}  // namespace

TEST_F(Dispatcher, QueuesFifoAndNeverExceedsACreditPerNode) {
  auto d = dispatcher({device(device_setup("d0")), device(device_setup("d1"))});
  for (auto c : {"c1", "c2", "c3", "c4", "c5"})
    evaluate(d, c);
  env.run_messages();
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1"}));
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2"}));
  auto s = status(d);
  EXPECT_EQ(s.root().getQueued(), 3u);
  EXPECT_EQ(s.root().getInFlight(), 2u);
  EXPECT_EQ(s.node(0).getInFlight(), 1u);
  EXPECT_EQ(s.node(0).getCredits(), 1u);
  EXPECT_TRUE(replies().empty());

  elapse(1s);  // both answer; c3 and c4 go out in order
  auto first = replies();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].candidate, "c1");
  EXPECT_EQ(first[0].device, "d0");
  EXPECT_EQ(first[1].candidate, "c2");
  EXPECT_EQ(first[1].device, "d1");
  elapse(1s);
  elapse(1s);
  auto rest = replies();
  EXPECT_EQ(names(rest), strings({"c3", "c4", "c5"}));
  for (auto& r : rest)
    EXPECT_FALSE(r.error) << caf::to_string(r.error);

  // Dispatched in arrival order, never two at one device.
  strings order;
  for (auto& e : book->received)
    order.push_back(e.candidate);
  EXPECT_EQ(order, strings({"c1", "c2", "c3", "c4", "c5"}));
  EXPECT_EQ(book->max_busy["d0"], 1u);
  EXPECT_EQ(book->max_busy["d1"], 1u);

  auto done = status(d);
  EXPECT_EQ(done.root().getCompleted(), 5u);
  EXPECT_EQ(done.root().getQueued(), 0u);
  EXPECT_EQ(done.root().getInFlight(), 0u);
  EXPECT_EQ(done.node(0).getCompleted() + done.node(1).getCompleted(), 5u);
  EXPECT_EQ(done.node(0).getNodeId().cStr(), std::string("d0"));
  EXPECT_EQ(done.node(1).getNodeId().cStr(), std::string("d1"));
}

TEST_F(Dispatcher, CreditsBoundEachNodeAndTheLeastLoadedNodeGetsWork) {
  auto cfg = config();
  cfg.credits_per_node = 2;
  auto d = dispatcher({device(device_setup("d0", 5s)), device(device_setup("d1", 1s)), device(device_setup("d2", 5s))}, cfg);
  // One each before any node gets a second (first-free would give d0 two).
  for (auto c : {"c1", "c2", "c3"})
    evaluate(d, c);
  env.run_messages();
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1"}));
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2"}));
  EXPECT_EQ(book->candidates_at("d2"), strings({"c3"}));

  elapse(1s);  // d1 is empty again while d0 and d2 hold one each
  EXPECT_EQ(names(replies()), strings({"c2"}));
  evaluate(d, "c4");
  env.run_messages();
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2", "c4"}));

  // Fill everything: 2 credits each, the rest waits.
  for (auto c : {"c5", "c6", "c7", "c8"})
    evaluate(d, c);
  env.run_messages();
  auto s = status(d);
  for (unsigned i = 0; i < 3; ++i)
    EXPECT_EQ(s.node(i).getInFlight(), 2u) << i;
  EXPECT_EQ(s.root().getQueued(), 1u);
  EXPECT_EQ(s.root().getInFlight(), 6u);
  for (int i = 0; i < 20; ++i)
    elapse(1s);
  EXPECT_EQ(replies().size(), 7u);
  for (auto& n : {"d0", "d1", "d2"})
    EXPECT_EQ(book->max_busy[n], 2u) << n;
}

TEST_F(Dispatcher, OverloadedRequestIsRequeuedAndAnsweredByAnotherNode) {
  auto d = dispatcher({device(device_setup("d0", 1s).refusing({1})), device(device_setup("d1", 1s))});
  evaluate(d, "c1");
  evaluate(d, "c2");
  env.run_messages();  // d0 refuses c1: it waits for d1, not for d0
  EXPECT_TRUE(replies().empty()) << "a refusal reached the requester";
  auto s = status(d);
  EXPECT_EQ(s.root().getRequeued(), 1u);
  EXPECT_EQ(s.root().getQueued(), 1u);
  EXPECT_TRUE(s.node(0).getAlive());

  elapse(1s);
  elapse(1s);
  auto rs = replies();
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].candidate, "c2");
  EXPECT_EQ(rs[1].candidate, "c1");
  EXPECT_EQ(rs[1].device, "d1");
  EXPECT_FALSE(rs[1].error) << caf::to_string(rs[1].error);
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1"}));  // no new work after refusing

  // With none of our requests there, the refusing node gets work again after
  // overload_retry (5 s after its refusal).
  elapse(2500ms);
  evaluate(d, "c3");
  evaluate(d, "c4");
  env.run_messages();
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1"}));
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2", "c1", "c3"}));
  elapse(500ms);  // t = 5 s: d0 takes work again
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1", "c4"}));
  elapse(1s);
  auto later = replies();
  ASSERT_EQ(later.size(), 2u);
  EXPECT_EQ(later[0].candidate, "c3");
  EXPECT_EQ(later[1].candidate, "c4");
  EXPECT_EQ(later[1].device, "d0");
}

TEST_F(Dispatcher, RefusingNodeTakesWorkOnceOneOfItsRequestsFinishes) {
  auto cfg = config();
  cfg.credits_per_node = 2;
  cfg.overload_retry = 60s;
  // d0 refuses its second evaluation while it holds its first.
  auto d = dispatcher({device(device_setup("d0", 2s).refusing({2})), device(device_setup("d1", 10s))}, cfg);
  evaluate(d, "c1");  // d0
  evaluate(d, "c2");  // d1
  evaluate(d, "c3");  // d0 (ties: lowest index), refused; requeued to d1
  env.run_messages();
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1", "c3"}));
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2", "c3"}));
  evaluate(d, "c4");  // waits: d0 has a credit but refused, d1 is full
  env.run_messages();
  auto s = status(d);
  EXPECT_EQ(s.root().getQueued(), 1u);
  EXPECT_EQ(s.root().getRequeued(), 1u);
  EXPECT_EQ(s.node(0).getInFlight(), 1u);
  elapse(1999ms);
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1", "c3"}));
  elapse(1ms);  // d0 answers c1: it takes c4
  EXPECT_EQ(names(replies()), strings({"c1"}));
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1", "c3", "c4"}));
}

TEST_F(Dispatcher, WorkOfANodeThatGoesDownIsRequeuedAndAnswered) {
  auto d0 = device(device_setup("d0", 5s));
  auto d = dispatcher({d0, device(device_setup("d1", 1s))});
  evaluate(d, "c1");  // d0
  evaluate(d, "c2");  // d1
  env.run_messages();
  kill(d0);
  auto s = status(d);
  EXPECT_FALSE(s.node(0).getAlive());
  EXPECT_TRUE(s.node(1).getAlive());
  EXPECT_EQ(s.node(0).getInFlight(), 0u);
  EXPECT_EQ(s.root().getRequeued(), 1u);
  EXPECT_EQ(s.root().getQueued(), 1u);
  elapse(1s);
  elapse(1s);
  auto rs = replies();
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].candidate, "c2");
  EXPECT_EQ(rs[1].candidate, "c1");
  EXPECT_EQ(rs[1].device, "d1");
  EXPECT_FALSE(rs[1].error) << caf::to_string(rs[1].error);
  evaluate(d, "c3");  // the dead node gets nothing more
  env.run_messages();
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1"}));
}

TEST_F(Dispatcher, NodeWhoseRequestTimesOutAtTheTransportIsTakenAsLost) {
  // d0 never answers (a frozen host): the request fails after the deadline the dispatcher
  // assumes (100 s) plus the margin (1 s), and its work moves to d1.
  auto d = dispatcher({device(device_setup("d0").frozen()), device(device_setup("d1", 1s))});
  evaluate(d, "c1");  // d0
  evaluate(d, "c2");  // d1
  env.run_messages();
  elapse(1s);
  EXPECT_EQ(names(replies()), strings({"c2"}));
  elapse(99s);
  EXPECT_TRUE(replies().empty());
  EXPECT_TRUE(status(d).node(0).getAlive());
  elapse(1s);
  auto s = status(d);
  EXPECT_FALSE(s.node(0).getAlive());
  EXPECT_EQ(s.root().getRequeued(), 1u);
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2", "c1"}));
  elapse(1s);
  auto rs = replies();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].candidate, "c1");
  EXPECT_EQ(rs[0].device, "d1");
}

TEST_F(Dispatcher, StragglerIsCopiedToAnIdleNodeAndOnlyTheFirstAnswerArrives) {
  auto d = dispatcher({device(device_setup("d0", 1s)), device(device_setup("d1", 30s))});
  // Three completions at d0 (1 s each): the threshold is max(2 s, 2 x 1 s) = 2 s.
  for (auto c : {"w1", "w2", "w3"}) {
    evaluate(d, c);
    env.run_messages();
    elapse(1s);
  }
  EXPECT_EQ(names(replies()), strings({"w1", "w2", "w3"}));
  EXPECT_EQ(status(d).root().getRedispatched(), 0u);

  evaluate(d, "c1");  // d0
  evaluate(d, "c2");  // d1, the straggler
  env.run_messages();
  elapse(1s);  // d0 answers c1 and idles; c2 has run 1 s: not yet a straggler
  EXPECT_EQ(names(replies()), strings({"c1"}));
  EXPECT_EQ(book->candidates_at("d0"), strings({"w1", "w2", "w3", "c1"}));
  elapse(999ms);
  EXPECT_EQ(book->candidates_at("d0").size(), 4u);
  elapse(1ms);  // 2 s in flight: copied to d0
  EXPECT_EQ(book->candidates_at("d0"), strings({"w1", "w2", "w3", "c1", "c2"}));
  auto s = status(d);
  EXPECT_EQ(s.root().getRedispatched(), 1u);
  EXPECT_EQ(s.root().getInFlight(), 1u);  // one request, two attempts
  EXPECT_EQ(s.node(0).getInFlight(), 1u);
  EXPECT_EQ(s.node(1).getInFlight(), 1u);

  elapse(1s);  // the copy answers first
  auto rs = replies();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].candidate, "c2");
  EXPECT_EQ(rs[0].device, "d0");
  // Never a second copy, and d1 keeps its credit until it answers.
  elapse(10s);
  EXPECT_EQ(status(d).node(1).getInFlight(), 1u);
  elapse(20s);  // d1's late answer is dropped and its credit freed
  EXPECT_TRUE(replies().empty()) << "a second answer reached the requester";
  auto after = status(d);
  EXPECT_EQ(after.node(1).getInFlight(), 0u);
  EXPECT_EQ(after.root().getRedispatched(), 1u);
  EXPECT_EQ(after.root().getCompleted(), 5u);
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2"}));
}

TEST_F(Dispatcher, RequestGetsOneCopyAtMostAndTheOriginalMayWin) {
  // c2 is a hard candidate: 30 s on every device, 35 s on d1.
  auto hard = [](const char* name, milliseconds d) {
    return device_setup(name).taking("c2", d);
  };
  auto d = dispatcher({device(hard("d0", 30s)), device(hard("d1", 35s)),
                       device(hard("d2", 30s))});
  for (auto c : {"w1", "w2", "w3"}) {
    evaluate(d, c);
    env.run_messages();
    elapse(1s);
  }
  EXPECT_EQ(names(replies()), strings({"w1", "w2", "w3"}));
  evaluate(d, "c2");  // d0
  env.run_messages();
  elapse(2s);  // a straggler: copied to d1, the lowest idle node
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2"}));
  elapse(10s);  // d2 idles, but c2 has its copy
  EXPECT_TRUE(book->candidates_at("d2").empty());
  auto s = status(d);
  EXPECT_EQ(s.root().getRedispatched(), 1u);
  EXPECT_EQ(s.root().getInFlight(), 1u);
  elapse(18s);  // t = 30 s: the original answers first
  auto rs = replies();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].candidate, "c2");
  EXPECT_EQ(rs[0].device, "d0");
  EXPECT_EQ(status(d).node(1).getInFlight(), 1u);  // the copy holds d1 until it answers
  // A new request meanwhile goes to an idle node, not to d1.
  evaluate(d, "c3");
  env.run_messages();
  EXPECT_EQ(book->candidates_at("d0"), strings({"w1", "w2", "w3", "c2", "c3"}));
  elapse(1s);
  EXPECT_EQ(names(replies()), strings({"c3"}));
  elapse(6s);  // the copy's answer is dropped
  EXPECT_TRUE(replies().empty()) << "the copy's answer reached the requester";
  auto after = status(d);
  EXPECT_EQ(after.node(1).getInFlight(), 0u);
  EXPECT_EQ(after.root().getRedispatched(), 1u);
  EXPECT_EQ(after.root().getCompleted(), 5u);
}

TEST_F(Dispatcher, NodeErrorsAreTheAnswer) {
  for (auto code : {error_code::bad_input, error_code::worker_timeout,
                    error_code::malformed_message, error_code::internal}) {
    book->received.clear();
    auto d = dispatcher({device(device_setup("bad").failing(code)), device(device_setup("good", 1s))});
    evaluate(d, "c1");
    env.run_messages();
    auto rs = replies();
    ASSERT_EQ(rs.size(), 1u) << messages::to_string(code);
    EXPECT_EQ(messages::code_of(rs[0].error), code);
    EXPECT_EQ(messages::message_of(rs[0].error), "bad failed c1");
    auto s = status(d);
    EXPECT_EQ(s.root().getRequeued(), 0u);
    EXPECT_EQ(s.root().getCompleted(), 1u);
    EXPECT_TRUE(s.node(0).getAlive());
    EXPECT_EQ(book->candidates_at("good"), strings{}) << "an error was retried elsewhere";
  }
}

TEST_F(Dispatcher, JoinAddsCapacity) {
  auto d = dispatcher({device(device_setup("d0", 1s))});
  evaluate(d, "c1");
  evaluate(d, "c2");
  env.run_messages();
  EXPECT_EQ(status(d).root().getQueued(), 1u);
  auto d1 = device(device_setup("d1", 1s));
  env.self->send(d, messages::join_atom::value, caf::actor_cast<caf::actor>(d1));
  env.run_messages();
  EXPECT_EQ(book->candidates_at("d1"), strings({"c2"}));
  auto s = status(d);
  ASSERT_EQ(s.root().getNodes().size(), 2u);
  EXPECT_EQ(s.node(1).getIndex(), 1u);
  EXPECT_EQ(s.node(1).getNodeId().cStr(), std::string("d1"));
  EXPECT_EQ(s.root().getQueued(), 0u);
  elapse(1s);
  EXPECT_EQ(names(replies()), strings({"c1", "c2"}));
}

TEST_F(Dispatcher, NoNodeAliveAnswersWorkerUnavailable) {
  auto d0 = device(device_setup("d0").frozen());
  auto d1 = device(device_setup("d1").frozen());
  auto d = dispatcher({d0, d1});
  for (auto c : {"c1", "c2", "c3"})
    evaluate(d, c);
  env.run_messages();
  EXPECT_TRUE(replies().empty());
  kill(d0);
  EXPECT_TRUE(replies().empty()) << "d1 is still alive";
  kill(d1);
  auto rs = replies();
  ASSERT_EQ(rs.size(), 3u);
  for (auto& r : rs) {
    EXPECT_EQ(messages::code_of(r.error), error_code::worker_unavailable);
    EXPECT_EQ(messages::message_of(r.error), "no TPU node is alive");
  }
  evaluate(d, "c4");
  env.run_messages();
  rs = replies();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(messages::code_of(rs[0].error), error_code::worker_unavailable);

  auto empty = dispatcher({});
  evaluate(empty, "c5");
  env.run_messages();
  rs = replies();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(messages::code_of(rs[0].error), error_code::worker_unavailable);
}

TEST_F(Dispatcher, DeadlinePassesInTheQueue) {
  auto d = dispatcher({device(device_setup("d0", 5s))});
  evaluate(d, "c1", 10'000);
  evaluate(d, "c2", 3'000);
  env.run_messages();
  EXPECT_EQ(book->received.at(0).deadline_ms, 10'000u);  // passed on to the node
  elapse(3s);
  auto rs = replies();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(messages::code_of(rs[0].error), error_code::worker_timeout);
  elapse(2s);
  EXPECT_EQ(names(replies()), strings({"c1"}));
  EXPECT_EQ(book->candidates_at("d0"), strings({"c1"}));
}

TEST_F(Dispatcher, RemainingDeadlineGoesToTheNode) {
  auto d = dispatcher({device(device_setup("d0", 2s))});
  evaluate(d, "c1");
  evaluate(d, "c2", 5'000);
  env.run_messages();
  elapse(2s);  // c2 waited 2 s: the node gets the 3 s left
  ASSERT_EQ(book->received.size(), 2u);
  EXPECT_EQ(book->received[0].deadline_ms, 0u);
  EXPECT_EQ(book->received[1].deadline_ms, 3'000u);
}

TEST_F(Dispatcher, LoadAnalyzeAndInfoAreForwarded) {
  auto cfg = config();
  auto d0 = device(device_setup("d0", 5s));
  auto d = dispatcher({d0, device(device_setup("d1", 5s))}, cfg);
  evaluate(d, "c1");  // d0 busy: load goes to d1, the first with a free credit
  env.run_messages();
  env.self->send(d, messages::load_atom::value, std::string("/tasks/x"));
  env.run_messages();
  std::string loaded;
  ASSERT_TRUE(env.receive_now([&](payload& p) {
    std::string err;
    auto msg = messages::open_payload<schema::KernelSpec>(p, err);
    ASSERT_TRUE(msg) << err;
    loaded = msg->root<schema::KernelSpec>().getName();
  }));
  EXPECT_EQ(loaded, "d1:/tasks/x");

  // A load carrying the task's files (a supervisor's nodes on other hosts) goes the same way.
  capnp::MallocMessageBuilder lm;
  auto load = lm.initRoot<schema::LoadRequest>();
  load.setPath("/tasks/y");
  load.initTaskFiles(2);
  env.self->send(d, messages::load_atom::value, messages::make_payload<schema::LoadRequest>(lm));
  env.run_messages();
  ASSERT_TRUE(env.receive_now([&](payload& p) {
    std::string err;
    auto msg = messages::open_payload<schema::KernelSpec>(p, err);
    ASSERT_TRUE(msg) << err;
    loaded = msg->root<schema::KernelSpec>().getName();
  }));
  EXPECT_EQ(loaded, "d1:/tasks/y:2");

  auto info_id = [&] {
    env.self->send(d, messages::info_atom::value);
    env.run_messages();
    std::string id;
    EXPECT_TRUE(env.receive_now(
      [&](payload& p) {
        std::string err;
        auto msg = messages::open_payload<schema::NodeInfo>(p, err);
        ASSERT_TRUE(msg) << err;
        id = msg->root<schema::NodeInfo>().getNodeId();
      },
      [&](caf::error& e) { id = "error: " + caf::to_string(e); }));
    return id;
  };
  EXPECT_EQ(info_id(), "d0");
  kill(d0);
  EXPECT_EQ(info_id(), "d1");

  env.self->send(d, messages::analyze_atom::value, payload{});
  env.run_messages();
  EXPECT_EQ(analysis_answer(), "d1");
}

// A worker that dies under the reference's analysis is the host's trouble (a killed process)
// until it happens again: asked again, on another node first; the third death is the answer.
TEST_F(Dispatcher, AnAnalysisWhoseWorkerDiedIsAskedAgainElsewhereUpToTwice) {
  auto analyze = [&](messages::dispatcher_actor d) {
    env.self->send(d, messages::analyze_atom::value, payload{});
    env.run_messages();
    return analysis_answer();
  };
  auto d = dispatcher({device(device_setup("d0").crashing_analyses(1)), device(device_setup("d1"))});
  EXPECT_EQ(analyze(d), "d1");
  EXPECT_EQ(book->analyses["d0"], 1u);
  EXPECT_EQ(book->analyses["d1"], 1u);

  // One node: the same node again, once its worker is back.
  book->analyses.clear();
  auto one = dispatcher({device(device_setup("solo").crashing_analyses(2))});
  EXPECT_EQ(analyze(one), "solo");
  EXPECT_EQ(book->analyses["solo"], 3u);

  // Dying every time: the reference's doing, after three tries.
  book->analyses.clear();
  auto doomed = dispatcher({device(device_setup("a").crashing_analyses(9)),
                            device(device_setup("b").crashing_analyses(9))});
  EXPECT_EQ(analyze(doomed), "error: b: the worker died");
  EXPECT_EQ(book->analyses["a"] + book->analyses["b"], 3u);
}

// A request sent to a node that is then lost gets no answer, not even an error, before its
// own timeout (a dropped connection kills the proxy, not what was sent through it): the
// analysis goes on at another node as soon as the loss is known.
TEST_F(Dispatcher, AnAnalysisOutAtANodeThatIsLostGoesOnElsewhereAtOnce) {
  auto d0 = device(device_setup("d0").silent_analyses());
  auto d = dispatcher({d0, device(device_setup("d1"))});
  env.self->send(d, messages::analyze_atom::value, payload{});
  env.run_messages();
  ASSERT_EQ(book->analyses["d0"], 1u);  // the first node took it and holds it
  EXPECT_EQ(book->analyses["d1"], 0u);
  EXPECT_EQ(analysis_answer(), "");
  kill(d0);  // no clock moved: nowhere near any timeout
  EXPECT_EQ(analysis_answer(), "d1");
  EXPECT_EQ(book->analyses["d1"], 1u);
  // The abandoned request's timeout, later, answers nothing more.
  elapse(200s);
  EXPECT_EQ(analysis_answer(), "");
}

// ---------------------------------------------------------------- chip-aware dispatch

namespace {

// The NodeInfo a node process sends with its join.
payload announced(const std::string& id, const std::string& chip, const std::string& backend) {
  capnp::MallocMessageBuilder msg;
  auto info = msg.initRoot<schema::NodeInfo>();
  info.setSchemaVersion(schema::SCHEMA_VERSION);
  info.setNodeId(id);
  info.setChip(chip);
  info.setBackend(backend);
  return messages::make_payload<schema::NodeInfo>(msg);
}

class ChipDispatch : public Dispatcher {
protected:
  messages::dispatcher_actor waiting_dispatcher() {
    auto cfg = config();
    cfg.wait_for_nodes = true;
    cfg.log = [lines = said](const std::string& line) { lines->push_back(line); };
    return dispatcher({}, cfg);
  }

  void join(const messages::dispatcher_actor& d, const messages::tpu_node_actor& node,
            const std::string& id, const std::string& chip, const std::string& backend) {
    env.self->send(d, messages::join_atom::value, caf::actor_cast<caf::actor>(node),
                   announced(id, chip, backend));
    env.run_messages();
  }

  void evaluate_for(const messages::dispatcher_actor& d, const std::string& candidate,
                    const std::string& chip) {
    env.self->send(d, messages::evaluate_atom::value, eval_request(candidate, chip));
  }

  std::shared_ptr<std::vector<std::string>> said = std::make_shared<std::vector<std::string>>();
};

}  // namespace

TEST_F(ChipDispatch, ADeviceGetsOnlyRequestsForItsChip) {
  auto d = waiting_dispatcher();
  join(d, device(device_setup("v6e-0")), "h:1:0", "v6e", "jax-tpu");
  join(d, device(device_setup("v5e-0")), "h:2:0", "v5e", "jax-tpu");
  evaluate_for(d, "a1", "v5e");
  evaluate_for(d, "a2", "v5e");  // waits for the v5e device, not for the idle v6e one
  evaluate_for(d, "b1", "v6e");  // behind a2 in the queue, yet not held back by it
  env.run_messages();
  EXPECT_EQ(book->candidates_at("v5e-0"), strings({"a1"}));
  EXPECT_EQ(book->candidates_at("v6e-0"), strings({"b1"}));
  EXPECT_EQ(status(d).root().getQueued(), 1u);
  elapse(1s);
  EXPECT_EQ(book->candidates_at("v5e-0"), strings({"a1", "a2"}));
  EXPECT_EQ(book->candidates_at("v6e-0"), strings({"b1"}));
  elapse(1s);
  EXPECT_EQ(replies().size(), 3u);
  auto s = status(d);
  EXPECT_EQ(std::string(s.node(1).getChip().cStr()), "v5e");
  EXPECT_EQ(std::string(s.node(1).getBackend().cStr()), "jax-tpu");
  EXPECT_TRUE(said->empty());  // nothing waited for want of a node
}

TEST_F(ChipDispatch, ARequestNoNodeServesWaitsSaysWhyAndAModelNodeTakesIt) {
  auto d = waiting_dispatcher();
  join(d, device(device_setup("v6e-0")), "h:1:0", "v6e", "jax-tpu");
  evaluate_for(d, "x1", "v7x");
  evaluate_for(d, "x2", "v7x");
  evaluate_for(d, "any", "");  // no chip named: any node
  env.run_messages();
  EXPECT_EQ(book->candidates_at("v6e-0"), strings({"any"}));
  elapse(1s);
  EXPECT_EQ(book->candidates_at("v6e-0"), strings({"any"}));  // idle, and still not given x1
  EXPECT_EQ(replies().size(), 1u);  // only "any" was answered
  EXPECT_EQ(status(d).root().getQueued(), 2u);
  ASSERT_EQ(said->size(), 1u);  // said once for the chip, not per request or per dispatch
  EXPECT_NE((*said)[0].find("chip v7x"), std::string::npos) << (*said)[0];
  EXPECT_NE((*said)[0].find("v6e jax-tpu"), std::string::npos) << (*said)[0];

  // A model node stands in for any chip.
  join(d, device(device_setup("model-0")), "h:3:0", "v6e", "model");
  EXPECT_EQ(book->candidates_at("model-0"), strings({"x1"}));
  elapse(1s);
  EXPECT_EQ(book->candidates_at("model-0"), strings({"x1", "x2"}));
  EXPECT_EQ(book->candidates_at("v6e-0"), strings({"any"}));
}

TEST_F(ChipDispatch, ANodeThatJoinedWithoutItsInfoTakesAnyChip) {
  auto d = waiting_dispatcher();
  env.self->send(d, messages::join_atom::value, caf::actor_cast<caf::actor>(device(device_setup("old-0"))));
  env.run_messages();
  evaluate_for(d, "y1", "v5p");
  env.run_messages();
  EXPECT_EQ(book->candidates_at("old-0"), strings({"y1"}));
  EXPECT_TRUE(said->empty());
}

TEST_F(ChipDispatch, WithoutWaitingForNodesAnUnservedChipIsUnavailableAtOnce) {
  auto d = dispatcher({});  // one process: answers instead of waiting
  join(d, device(device_setup("v6e-0")), "h:1:0", "v6e", "jax-tpu");
  evaluate_for(d, "z1", "v5e");
  env.run_messages();
  auto rs = replies();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(messages::code_of(rs[0].error), error_code::worker_unavailable);
  EXPECT_NE(messages::message_of(rs[0].error).find("chip v5e"), std::string::npos)
    << messages::message_of(rs[0].error);
  EXPECT_TRUE(book->received.empty());
}
