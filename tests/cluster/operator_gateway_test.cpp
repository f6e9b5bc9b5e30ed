// The operator gateway for real: its ZeroMQ socket on an ipc endpoint in a temp directory,
// real DEALER sockets as the operators' shells, and the supervisor's side through a
// scoped_actor's requests.
#include "cluster/operator_gateway.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/operator.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <gtest/gtest.h>

#include <capnp/message.h>
#include <zmq.hpp>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

using namespace maxkernel;
using namespace std::chrono_literals;
using messages::payload;
using schema::DecisionKind;

namespace {

// What a shell received, flattened for assertions.
struct event {
  std::string what;  // welcome, proposal, decided, notice, refused, ended
  std::string text;
  uint32_t seq = 0;
  uint32_t vertex = 0;
  std::string op;
  DecisionKind kind = DecisionKind::APPROVE;
};

class shell {
public:
  shell(zmq::context_t& ctx, const std::string& endpoint) : sock_(ctx, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.connect(endpoint);
  }

  void send_raw(const std::string& bytes) { sock_.send(zmq::buffer(bytes), zmq::send_flags::none); }

  void command(const std::function<void(schema::OperatorCommand::Builder)>& fill) {
    capnp::MallocMessageBuilder msg;
    auto cmd = msg.initRoot<schema::OperatorCommand>();
    cmd.setSchemaVersion(schema::SCHEMA_VERSION);
    fill(cmd);
    send_raw(messages::encode(msg));
  }
  void attach(const std::string& name) { command([&](auto c) { c.setAttach(name); }); }
  void ping() { command([](auto c) { c.setPing(); }); }
  void detach() { command([](auto c) { c.setDetach(); }); }
  void release() { command([](auto c) { c.setRelease(); }); }
  void decide(uint32_t seq, DecisionKind kind,
              const std::function<void(schema::Decision::Builder)>& more = {}) {
    command([&](auto c) {
      auto d = c.initDecision();
      d.setSchemaVersion(schema::SCHEMA_VERSION);
      d.setSeq(seq);
      d.setKind(kind);
      if (more)
        more(d);
    });
  }

  std::optional<event> next(std::chrono::milliseconds timeout = 2000ms) {
    zmq::pollitem_t items[] = {{sock_.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, timeout);
    if (!(items[0].revents & ZMQ_POLLIN))
      return std::nullopt;
    zmq::message_t m;
    EXPECT_TRUE(sock_.recv(m));
    std::string err;
    auto msg = messages::decode<schema::OperatorEvent>(m.to_string(), err);
    EXPECT_TRUE(msg) << err;
    if (!msg)
      return std::nullopt;
    auto ev = msg->root<schema::OperatorEvent>();
    event out;
    switch (ev.which()) {
      case schema::OperatorEvent::WELCOME:
        out.what = "welcome";
        out.text = ev.getWelcome();
        break;
      case schema::OperatorEvent::PROPOSAL:
        out.what = "proposal";
        out.seq = ev.getProposal().getSeq();
        out.vertex = ev.getProposal().getVertex().getIndex();
        break;
      case schema::OperatorEvent::DECIDED:
        out.what = "decided";
        out.seq = ev.getDecided().getSeq();
        out.op = ev.getDecided().getOperator();
        out.kind = ev.getDecided().getKind();
        out.text = ev.getDecided().getText();
        break;
      case schema::OperatorEvent::NOTICE:
        out.what = "notice";
        out.text = ev.getNotice();
        break;
      case schema::OperatorEvent::REFUSED:
        out.what = "refused";
        out.text = ev.getRefused();
        break;
      case schema::OperatorEvent::ENDED:
        out.what = "ended";
        out.text = ev.getEnded();
        break;
    }
    return out;
  }

  // Expects the next event to be `what`; returns it.
  event expect(const std::string& what) {
    auto ev = next();
    EXPECT_TRUE(ev) << "no event, expected " << what;
    if (!ev)
      return {};
    EXPECT_EQ(ev->what, what) << ev->text;
    return *ev;
  }

  bool quiet(std::chrono::milliseconds d = 100ms) { return !next(d); }

private:
  zmq::socket_t sock_;
};

payload proposal(uint32_t seq, uint32_t vertex, uint32_t auto_steps = 0) {
  capnp::MallocMessageBuilder msg;
  auto p = msg.initRoot<schema::Proposal>();
  p.setSchemaVersion(schema::SCHEMA_VERSION);
  p.setSeq(seq);
  p.setTask("rmsnorm");
  p.setChip("v6e");
  p.setTiming("modeled");
  p.initVertex().setIndex(vertex);
  p.setAutoSteps(auto_steps);
  return messages::make_payload<schema::Proposal>(msg);
}

payload decided_notice(uint32_t seq, const std::string& op) {
  capnp::MallocMessageBuilder msg;
  auto ev = msg.initRoot<schema::OperatorEvent>();
  ev.setSchemaVersion(schema::SCHEMA_VERSION);
  auto d = ev.initDecided();
  d.setSchemaVersion(schema::SCHEMA_VERSION);
  d.setSeq(seq);
  d.setKind(DecisionKind::APPROVE);
  d.setOperator(op);
  return messages::make_payload<schema::OperatorEvent>(msg);
}

struct decision_seen {
  uint32_t seq = 0;
  DecisionKind kind = DecisionKind::STOP;
  std::string op, text;
};

class OperatorGateway : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/maxkernel-gw-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    start(5000ms);
  }
  void TearDown() override {
    if (gw_)
      caf::anon_send_exit(gw_, caf::exit_reason::user_shutdown);
    gw_ = nullptr;
    std::filesystem::remove_all(dir_);
  }

  void start(std::chrono::milliseconds liveness) {
    cluster::operator_gateway_config cfg;
    cfg.endpoint = "ipc://" + dir_ + "/gw.sock";
    cfg.liveness = liveness;
    cfg.welcome = "task rmsnorm, mode hitl, chip v6e";
    auto gw = cluster::spawn_operator_gateway(sys_, cfg);
    ASSERT_TRUE(gw) << sys_.render(gw.error());
    gw_ = gw->handle;
    endpoint_ = gw->endpoint;
  }

  uint32_t status() {
    uint32_t n = 999;
    self_->request(gw_, 2s, messages::status_atom::value)
      .receive([&](uint32_t x) { n = x; },
               [&](caf::error& e) { ADD_FAILURE() << sys_.render(e); });
    return n;
  }

  // Polls the attached count until it is `n` (the gateway sees shells asynchronously).
  bool status_becomes(uint32_t n, std::chrono::milliseconds within = 2000ms) {
    auto until = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < until) {
      if (status() == n)
        return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  // The supervisor's answer to a propose request sent earlier.
  template <class Handle>
  std::optional<decision_seen> answer(Handle& h) {
    std::optional<decision_seen> out;
    h.receive(
      [&](payload& p) {
        std::string err;
        auto msg = messages::open_payload<schema::Decision>(p, err);
        ASSERT_TRUE(msg) << err;
        auto d = msg->root<schema::Decision>();
        out = decision_seen{d.getSeq(), d.getKind(), d.getOperator(), d.getText()};
      },
      [&](caf::error& e) { ADD_FAILURE() << sys_.render(e); });
    return out;
  }

  struct sys_config : caf::actor_system_config {
    sys_config() { messages::register_types(*this); }
  };

  std::string dir_;
  sys_config sys_cfg_;
  caf::actor_system sys_{sys_cfg_};
  caf::scoped_actor self_{sys_};
  messages::operator_actor gw_;
  std::string endpoint_;
  zmq::context_t ctx_{1};
};

TEST_F(OperatorGateway, AttachGetsTheWelcomeAndCounts) {
  EXPECT_EQ(endpoint_, "ipc://" + dir_ + "/gw.sock");
  EXPECT_EQ(status(), 0u);
  shell alice(ctx_, endpoint_);
  alice.attach("alice");
  auto w = alice.expect("welcome");
  EXPECT_EQ(w.text, "task rmsnorm, mode hitl, chip v6e");
  EXPECT_TRUE(alice.quiet());  // nothing waits: no proposal follows
  EXPECT_EQ(status(), 1u);
  shell bob(ctx_, endpoint_);
  bob.attach("bob");
  bob.expect("welcome");
  EXPECT_EQ(status(), 2u);
  bob.detach();
  EXPECT_TRUE(status_becomes(1));
}

TEST_F(OperatorGateway, ProposalGoesToEveryShellAndTheFirstDecisionAnswers) {
  shell alice(ctx_, endpoint_), bob(ctx_, endpoint_);
  alice.attach("alice");
  bob.attach("bob");
  alice.expect("welcome");
  bob.expect("welcome");
  auto h = self_->request(gw_, 5s, messages::propose_atom::value, proposal(1, 4));
  auto pa = alice.expect("proposal");
  auto pb = bob.expect("proposal");
  EXPECT_EQ(pa.seq, 1u);
  EXPECT_EQ(pa.vertex, 4u);
  EXPECT_EQ(pb.seq, 1u);
  bob.decide(1, DecisionKind::REJECT, [](auto d) { d.setText("blocks too small"); });
  auto got = answer(h);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->seq, 1u);
  EXPECT_EQ(got->kind, DecisionKind::REJECT);
  EXPECT_EQ(got->op, "bob");  // filled in from the attach name
  EXPECT_EQ(got->text, "blocks too small");
  for (auto* s : {&alice, &bob}) {
    auto d = s->expect("decided");
    EXPECT_EQ(d.seq, 1u);
    EXPECT_EQ(d.op, "bob");
    EXPECT_EQ(d.kind, DecisionKind::REJECT);
  }
  // Decided: alice's late answer to #1 is refused.
  alice.decide(1, DecisionKind::APPROVE);
  auto r = alice.expect("refused");
  EXPECT_NE(r.text.find("no proposal is waiting"), std::string::npos) << r.text;
  EXPECT_TRUE(bob.quiet());
}

// Several shells watch; one holds the hitl floor: the first to decide, until it releases it
// or detaches. Another shell's decision is refused with the holder's name.
TEST_F(OperatorGateway, OneShellHoldsTheFloorUntilItReleasesOrDetaches) {
  shell alice(ctx_, endpoint_), bob(ctx_, endpoint_);
  alice.attach("alice");
  bob.attach("bob");
  alice.expect("welcome");
  bob.expect("welcome");
  auto h1 = self_->request(gw_, 5s, messages::propose_atom::value, proposal(1, 0));
  alice.expect("proposal");
  bob.expect("proposal");
  alice.decide(1, DecisionKind::APPROVE);  // takes the free floor
  ASSERT_TRUE(answer(h1));
  alice.expect("decided");
  bob.expect("decided");

  auto h2 = self_->request(gw_, 5s, messages::propose_atom::value, proposal(2, 1));
  alice.expect("proposal");
  bob.expect("proposal");
  bob.decide(2, DecisionKind::STOP);
  auto r = bob.expect("refused");
  EXPECT_NE(r.text.find("alice holds the hitl floor"), std::string::npos) << r.text;
  EXPECT_TRUE(alice.quiet());
  bob.release();  // bob holds nothing to release
  r = bob.expect("refused");
  EXPECT_NE(r.text.find("does not hold"), std::string::npos) << r.text;

  alice.release();
  for (auto* s : {&alice, &bob}) {
    auto n = s->expect("notice");
    EXPECT_NE(n.text.find("the hitl floor is free: alice released it"), std::string::npos)
      << n.text;
  }
  bob.decide(2, DecisionKind::REJECT);  // the floor is bob's now
  auto got = answer(h2);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->op, "bob");
  alice.expect("decided");
  bob.expect("decided");

  auto h3 = self_->request(gw_, 5s, messages::propose_atom::value, proposal(3, 2));
  alice.expect("proposal");
  bob.expect("proposal");
  alice.decide(3, DecisionKind::APPROVE);
  r = alice.expect("refused");
  EXPECT_NE(r.text.find("bob holds the hitl floor"), std::string::npos) << r.text;
  bob.detach();  // its floor goes with it
  auto n = alice.expect("notice");
  EXPECT_NE(n.text.find("the hitl floor is free: bob detached"), std::string::npos) << n.text;
  alice.decide(3, DecisionKind::APPROVE);
  got = answer(h3);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->op, "alice");
}

TEST_F(OperatorGateway, WrongSeqIsRefusedToThatShellOnly) {
  shell alice(ctx_, endpoint_), bob(ctx_, endpoint_);
  alice.attach("alice");
  bob.attach("bob");
  alice.expect("welcome");
  bob.expect("welcome");
  auto h = self_->request(gw_, 5s, messages::propose_atom::value, proposal(2, 7));
  alice.expect("proposal");
  bob.expect("proposal");
  alice.decide(1, DecisionKind::APPROVE);
  auto r = alice.expect("refused");
  EXPECT_NE(r.text.find("#1"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("#2"), std::string::npos) << r.text;
  EXPECT_TRUE(bob.quiet());
  // The proposal still waits: the right answer goes through, with an explicit operator name.
  alice.decide(2, DecisionKind::APPROVE, [](auto d) { d.setOperator("alice@console"); });
  auto got = answer(h);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->kind, DecisionKind::APPROVE);
  EXPECT_EQ(got->op, "alice@console");
}

TEST_F(OperatorGateway, InvalidDecisionsAreRefusedWithTheReason) {
  shell alice(ctx_, endpoint_);
  alice.attach("alice");
  alice.expect("welcome");
  auto h = self_->request(gw_, 5s, messages::propose_atom::value, proposal(1, 1));
  alice.expect("proposal");
  struct bad {
    DecisionKind kind;
    std::function<void(schema::Decision::Builder)> fill;
    std::string why;
  };
  std::vector<bad> cases = {
    {DecisionKind::HINT, [](auto d) { d.setText("  "); }, "hint needs a text"},
    {DecisionKind::HAND_OVER, [](auto d) { d.setSteps(0); }, "steps >= 1"},
    {DecisionKind::TAKE_OVER, {}, "takeover needs the kernel's source"},
    {DecisionKind::EDIT, {}, "edit needs parameter changes or a source"},
    {DecisionKind::EDIT,
     [](auto d) {
       auto c = d.initChanges(2);
       c[0].setName("bm");
       c[0].setValue("256");
       c[1].setName("order");
       c[1].setValue("kn");  // not JSON: a string needs its quotes
     },
     "the value of order is not a JSON literal"},
    {DecisionKind::EDIT,
     [](auto d) {
       d.initChanges(1)[0].setName("bm");
       d.getChanges()[0].setValue("1");
       d.setSource("def workload(x): return x\n");
     },
     "not both"},
  };
  for (auto& c : cases) {
    alice.decide(1, c.kind, c.fill);
    auto r = alice.expect("refused");
    EXPECT_NE(r.text.find(c.why), std::string::npos) << r.text;
  }
  // A reject without feedback is fine.
  alice.decide(1, DecisionKind::REJECT);
  auto got = answer(h);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->kind, DecisionKind::REJECT);
  EXPECT_EQ(got->text, "");
  alice.expect("decided");
}

TEST_F(OperatorGateway, ALateShellGetsTheWaitingProposal) {
  auto h = self_->request(gw_, 5s, messages::propose_atom::value, proposal(5, 9));
  shell carol(ctx_, endpoint_);
  carol.attach("carol");
  carol.expect("welcome");
  auto p = carol.expect("proposal");
  EXPECT_EQ(p.seq, 5u);
  EXPECT_EQ(p.vertex, 9u);
  carol.decide(5, DecisionKind::HAND_OVER, [](auto d) { d.setSteps(3); });
  auto got = answer(h);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->kind, DecisionKind::HAND_OVER);
  EXPECT_EQ(got->op, "carol");
}

TEST_F(OperatorGateway, ASecondProposalWhileOneWaitsIsBadInput) {
  auto h1 = self_->request(gw_, 5s, messages::propose_atom::value, proposal(1, 1));
  std::optional<caf::error> err;
  self_->request(gw_, 2s, messages::propose_atom::value, proposal(2, 2))
    .receive([&](payload&) { ADD_FAILURE() << "second proposal accepted"; },
             [&](caf::error& e) { err = e; });
  ASSERT_TRUE(err);
  EXPECT_EQ(messages::code_of(*err), messages::error_code::bad_input);
  EXPECT_NE(messages::message_of(*err).find("#1"), std::string::npos);
  // A proposal handed over to auto is a notice, not a request.
  err.reset();
  shell alice(ctx_, endpoint_);
  alice.attach("alice");
  alice.expect("welcome");
  alice.expect("proposal");
  alice.decide(1, DecisionKind::STOP);
  ASSERT_TRUE(answer(h1));
  alice.expect("decided");
  self_->request(gw_, 2s, messages::propose_atom::value, proposal(3, 3, 2))
    .receive([&](payload&) { ADD_FAILURE() << "auto proposal accepted"; },
             [&](caf::error& e) { err = e; });
  ASSERT_TRUE(err);
  EXPECT_EQ(messages::code_of(*err), messages::error_code::bad_input);
}

TEST_F(OperatorGateway, APolicyDecisionWithdrawsTheProposal) {
  shell alice(ctx_, endpoint_);
  alice.attach("alice");
  alice.expect("welcome");
  [[maybe_unused]] auto h = self_->request(gw_, 5s, messages::propose_atom::value, proposal(3, 5));
  alice.expect("proposal");
  caf::anon_send(gw_, messages::notify_atom::value, decided_notice(3, "policy"));
  auto d = alice.expect("decided");
  EXPECT_EQ(d.seq, 3u);
  EXPECT_EQ(d.op, "policy");
  alice.decide(3, DecisionKind::APPROVE);
  auto r = alice.expect("refused");
  EXPECT_NE(r.text.find("no proposal is waiting"), std::string::npos) << r.text;
  // The next proposal is taken (the withdrawn one no longer blocks it), and a late shell
  // gets that one, not the withdrawn one.
  auto h2 = self_->request(gw_, 5s, messages::propose_atom::value, proposal(4, 6));
  EXPECT_EQ(alice.expect("proposal").seq, 4u);
  shell bob(ctx_, endpoint_);
  bob.attach("bob");
  bob.expect("welcome");
  EXPECT_EQ(bob.expect("proposal").seq, 4u);
  EXPECT_TRUE(bob.quiet());
  bob.decide(4, DecisionKind::APPROVE);
  auto got = answer(h2);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->seq, 4u);
}

TEST_F(OperatorGateway, NoticesAndTheEndReachEveryShell) {
  shell alice(ctx_, endpoint_), bob(ctx_, endpoint_);
  alice.attach("alice");
  bob.attach("bob");
  alice.expect("welcome");
  bob.expect("welcome");
  auto event = [](auto fill) {
    capnp::MallocMessageBuilder msg;
    auto ev = msg.initRoot<schema::OperatorEvent>();
    ev.setSchemaVersion(schema::SCHEMA_VERSION);
    fill(ev);
    return messages::make_payload<schema::OperatorEvent>(msg);
  };
  caf::anon_send(gw_, messages::notify_atom::value,
                 event([](auto ev) { ev.setNotice("evaluating vertex 3"); }));
  caf::anon_send(gw_, messages::notify_atom::value,
                 event([](auto ev) { ev.setEnded("budget reached; best vertex 2"); }));
  for (auto* s : {&alice, &bob}) {
    EXPECT_EQ(s->expect("notice").text, "evaluating vertex 3");
    EXPECT_EQ(s->expect("ended").text, "budget reached; best vertex 2");
  }
}

TEST_F(OperatorGateway, MalformedFramesAreRefusedAndTheGatewayGoesOn) {
  shell mallory(ctx_, endpoint_);
  mallory.send_raw("this is not a capnp message");
  EXPECT_NE(mallory.expect("refused").text.find("malformed"), std::string::npos);
  mallory.send_raw("");
  EXPECT_NE(mallory.expect("refused").text.find("malformed"), std::string::npos);
  // Two frames in one message.
  zmq::socket_t raw(ctx_, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(endpoint_);
  raw.send(zmq::str_buffer("a"), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("b"), zmq::send_flags::none);
  zmq::pollitem_t items[] = {{raw.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, 2000ms);
  ASSERT_TRUE(items[0].revents & ZMQ_POLLIN);
  zmq::message_t reply;
  ASSERT_TRUE(raw.recv(reply));
  std::string err;
  auto refused = messages::decode<schema::OperatorEvent>(reply.to_string(), err);
  ASSERT_TRUE(refused) << err;
  ASSERT_TRUE(refused->root<schema::OperatorEvent>().isRefused());
  EXPECT_NE(std::string(refused->root<schema::OperatorEvent>().getRefused()).find("got 2 frames"),
            std::string::npos);
  // Not attached: anything but attach is refused.
  mallory.ping();
  EXPECT_EQ(mallory.expect("refused").text, "attach first");
  mallory.decide(1, DecisionKind::APPROVE);
  EXPECT_EQ(mallory.expect("refused").text, "attach first");
  mallory.attach("   ");
  EXPECT_NE(mallory.expect("refused").text.find("name"), std::string::npos);
  EXPECT_EQ(status(), 0u);
  // An old schema version is malformed too.
  mallory.command([](auto c) {
    c.setSchemaVersion(schema::SCHEMA_VERSION + 1);
    c.setAttach("mallory");
  });
  EXPECT_NE(mallory.expect("refused").text.find("schema version"), std::string::npos);
  // Still serving.
  mallory.attach("mallory");
  mallory.expect("welcome");
  EXPECT_EQ(status(), 1u);
}

TEST_F(OperatorGateway, ASilentShellIsDetachedAfterTheLivenessPeriod) {
  caf::anon_send_exit(gw_, caf::exit_reason::user_shutdown);
  cluster::operator_gateway_config cfg;
  cfg.endpoint = "ipc://" + dir_ + "/short.sock";
  cfg.liveness = 300ms;
  auto gw = cluster::spawn_operator_gateway(sys_, cfg);
  ASSERT_TRUE(gw) << sys_.render(gw.error());
  gw_ = gw->handle;
  endpoint_ = gw->endpoint;
  shell alice(ctx_, endpoint_), bob(ctx_, endpoint_);
  alice.attach("alice");
  bob.attach("bob");
  alice.expect("welcome");
  bob.expect("welcome");
  // alice pings, bob is silent: after well over the period only alice is attached.
  auto until = std::chrono::steady_clock::now() + 700ms;
  while (std::chrono::steady_clock::now() < until) {
    alice.ping();
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(status(), 1u);
  // bob's ping now is refused: he must attach again.
  bob.ping();
  EXPECT_EQ(bob.expect("refused").text, "attach first");
  EXPECT_TRUE(status_becomes(0, 2000ms));  // alice stopped pinging too
}

TEST_F(OperatorGateway, ABindFailureNamesTheEndpoint) {
  cluster::operator_gateway_config cfg;
  cfg.endpoint = "ipc://" + dir_ + "/no/such/dir/gw.sock";
  auto gw = cluster::spawn_operator_gateway(sys_, cfg);
  ASSERT_FALSE(gw);
  EXPECT_EQ(messages::code_of(gw.error()), messages::error_code::bad_input);
  EXPECT_NE(messages::message_of(gw.error()).find(cfg.endpoint), std::string::npos);
  cfg.endpoint = "carrier-pigeon://here";
  gw = cluster::spawn_operator_gateway(sys_, cfg);
  ASSERT_FALSE(gw);
  EXPECT_NE(messages::message_of(gw.error()).find("carrier-pigeon://here"), std::string::npos);
  // The same endpoint twice: the second bind fails (ZeroMQ alone would take over an ipc
  // path from the gateway serving it).
  cfg.endpoint = endpoint_;
  gw = cluster::spawn_operator_gateway(sys_, cfg);
  ASSERT_FALSE(gw);
  EXPECT_NE(messages::message_of(gw.error()).find("another process listens"), std::string::npos);
  shell alice(ctx_, endpoint_);
  alice.attach("alice");
  alice.expect("welcome");  // the first gateway still serves it
  cfg.endpoint = "tcp://127.0.0.1:*";
  auto tcp = cluster::spawn_operator_gateway(sys_, cfg);
  ASSERT_TRUE(tcp);
  cfg.endpoint = tcp->endpoint;
  gw = cluster::spawn_operator_gateway(sys_, cfg);
  ASSERT_FALSE(gw);
  EXPECT_NE(messages::message_of(gw.error()).find(tcp->endpoint), std::string::npos);
  caf::anon_send_exit(tcp->handle, caf::exit_reason::user_shutdown);
}

TEST_F(OperatorGateway, AnyPortReportsTheRealOne) {
  cluster::operator_gateway_config cfg;
  cfg.endpoint = "tcp://127.0.0.1:*";
  auto gw = cluster::spawn_operator_gateway(sys_, cfg);
  ASSERT_TRUE(gw) << sys_.render(gw.error());
  EXPECT_EQ(gw->endpoint.rfind("tcp://127.0.0.1:", 0), 0u) << gw->endpoint;
  EXPECT_EQ(gw->endpoint.find('*'), std::string::npos) << gw->endpoint;
  shell alice(ctx_, gw->endpoint);
  alice.attach("alice");
  EXPECT_EQ(alice.expect("welcome").text, "maxkernel operator gateway at " + gw->endpoint);
  caf::anon_send_exit(gw->handle, caf::exit_reason::user_shutdown);
}

TEST_F(OperatorGateway, StoppingAnswersTheWaitingRequestAndTellsTheShells) {
  shell alice(ctx_, endpoint_);
  alice.attach("alice");
  alice.expect("welcome");
  auto h = self_->request(gw_, 5s, messages::propose_atom::value, proposal(1, 1));
  alice.expect("proposal");
  caf::anon_send_exit(gw_, caf::exit_reason::user_shutdown);
  gw_ = nullptr;
  std::optional<caf::error> err;
  h.receive([&](payload&) { ADD_FAILURE() << "answered after stop"; },
            [&](caf::error& e) { err = e; });
  ASSERT_TRUE(err);
  EXPECT_EQ(alice.expect("ended").text, "the operator gateway stopped");
  // The socket is closed: the endpoint can be bound again.
  bool rebound = false;
  for (int i = 0; i < 100 && !rebound; ++i) {
    cluster::operator_gateway_config cfg;
    cfg.endpoint = endpoint_;
    auto gw = cluster::spawn_operator_gateway(sys_, cfg);
    if (gw) {
      rebound = true;
      caf::anon_send_exit(gw->handle, caf::exit_reason::user_shutdown);
    } else {
      std::this_thread::sleep_for(10ms);
    }
  }
  EXPECT_TRUE(rebound);
}

}  // namespace
