// `maxkernel attach`'s console end to end: a real operator gateway (ipc endpoint in a temp
// directory), the console function in a thread with a script as its input, the supervisor's
// side through a scoped_actor's requests. It asserts on the decisions the supervisor gets
// and on the console's printed lines.
#include "cli/operator_console.hpp"
#include "cluster/operator_gateway.hpp"
#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/operator.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <gtest/gtest.h>
#include <zmq.hpp>

#include <capnp/message.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

using namespace maxkernel;
using namespace std::chrono_literals;
using messages::payload;
using schema::DecisionKind;

namespace {

struct decision_seen {
  uint32_t seq = 0;
  DecisionKind kind = DecisionKind::APPROVE;
  std::string op, text, source;
  std::vector<std::pair<std::string, std::string>> changes;
  uint32_t steps = 0;
};

payload proposal(uint32_t seq, uint32_t auto_steps = 0,
                 const std::function<void(schema::Proposal::Builder)>& more = {}) {
  capnp::MallocMessageBuilder msg;
  auto p = msg.initRoot<schema::Proposal>();
  p.setSchemaVersion(schema::SCHEMA_VERSION);
  p.setSeq(seq);
  p.setTask("rmsnorm");
  p.setChip("v6e");
  p.setTiming("modeled");
  auto v = p.initVertex();
  v.setIndex(seq + 3);
  v.setParent(static_cast<int32_t>(seq) + 1);
  v.setStrategy("growBlock {\"bm\":512}");
  p.setAutoSteps(auto_steps);
  if (more)
    more(p);
  return messages::make_payload<schema::Proposal>(msg);
}

template <class Fill>
payload event(Fill fill) {
  capnp::MallocMessageBuilder msg;
  auto ev = msg.initRoot<schema::OperatorEvent>();
  ev.setSchemaVersion(schema::SCHEMA_VERSION);
  fill(ev);
  return messages::make_payload<schema::OperatorEvent>(msg);
}

struct sys_config : caf::actor_system_config {
  sys_config() { messages::register_types(*this); }
};

// The console in a thread on a scripted input; its output is read after it returns.
struct console_run {
  std::istringstream in;
  std::ostringstream out, err;
  int rc = -1;
  std::thread thread;

  console_run(cli::console_options opts, const std::string& script) : in(script) {
    thread = std::thread([this, opts] { rc = cli::run_console(opts, in, out, err); });
  }
  void join() {
    if (thread.joinable())
      thread.join();
  }
  ~console_run() { join(); }
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class OperatorConsole : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/maxkernel-console-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cluster::operator_gateway_config cfg;
    cfg.endpoint = "ipc://" + dir_ + "/gw.sock";
    cfg.welcome = "task rmsnorm, mode hitl, chip v6e";
    auto gw = cluster::spawn_operator_gateway(sys_, cfg);
    ASSERT_TRUE(gw) << sys_.render(gw.error());
    gw_ = gw->handle;
    endpoint_ = gw->endpoint;
  }
  void TearDown() override {
    caf::anon_send_exit(gw_, caf::exit_reason::user_shutdown);
    std::filesystem::remove_all(dir_);
  }

  cli::console_options options(const std::string& name = "alice") {
    cli::console_options o;
    o.endpoint = endpoint_;
    o.name = name;
    o.connect_timeout_seconds = 3;
    return o;
  }

  uint32_t status() {
    uint32_t n = 999;
    self_->request(gw_, 2s, messages::status_atom::value)
      .receive([&](uint32_t x) { n = x; },
               [&](caf::error& e) { ADD_FAILURE() << sys_.render(e); });
    return n;
  }
  bool status_becomes(uint32_t n) {
    for (int i = 0; i < 300; ++i) {
      if (status() == n)
        return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  std::optional<decision_seen> propose(const payload& p) {
    std::optional<decision_seen> out;
    self_->request(gw_, 5s, messages::propose_atom::value, p)
      .receive(
        [&](payload& answer) {
          std::string err;
          auto msg = messages::open_payload<schema::Decision>(answer, err);
          ASSERT_TRUE(msg) << err;
          auto d = msg->root<schema::Decision>();
          decision_seen s{d.getSeq(), d.getKind(), d.getOperator(), d.getText(), d.getSource(),
                          {}, d.getSteps()};
          for (auto c : d.getChanges())
            s.changes.emplace_back(c.getName(), c.getValue());
          out = s;
        },
        [&](caf::error& e) { ADD_FAILURE() << sys_.render(e); });
    return out;
  }

  void notify(const payload& ev) { caf::anon_send(gw_, messages::notify_atom::value, ev); }

  std::string dir_;
  sys_config sys_cfg_;
  caf::actor_system sys_{sys_cfg_};
  caf::scoped_actor self_{sys_};
  messages::operator_actor gw_;
  std::string endpoint_;
};

TEST_F(OperatorConsole, AScriptOnStdinAnswersEachProposalInTurn) {
  auto kernel = dir_ + "/mine.py";
  std::ofstream(kernel) << "import jax\ndef workload(x):\n    return x\n";
  std::string script = "frobnicate\n"
                       "edit bm=abc\n"
                       "approve\n"                              // #1
                       "# a comment, then help\n"
                       "help\n"
                       "edit bm=256 order='\"kn\"'\n"           // #2
                       "takeover " + dir_ + "/missing.py\n"
                       "takeover " + kernel + "\n"              // #3
                       "hint keep the sum in f32\n"             // #4
                       "handover 0\n"
                       "handover 2\n"                           // #5
                       "stop\n"                                 // #6 (after an auto notice)
                       "approve\n";                             // never read: the search ends
  console_run console(options(), script);
  ASSERT_TRUE(status_becomes(1));

  auto d1 = propose(proposal(1, 0, [](auto p) {
    auto v = p.getVertex();
    v.setCorrect(true);
    v.setVerdict("all 3 cases pass");
    v.setRationale("bigger row blocks amortize the per-step overhead");
    v.setTimeUs(10);
    v.setRooflineUs(5);
    v.setHasDiagnosis(true);
    auto d = v.initDiagnosis();
    d.setBound("memory");
    d.setBottleneckCall(0);
    d.setBottleneckCallName("rmsnorm_kernel");
    d.setHeadroomUs(5);
    d.initSuggestions(1)[0].setRationale("grow bm: the x tile is 64 KiB of 16 MiB VMEM");
    p.setExpectedEffect("fewer grid steps, ~20% faster");
    p.setDiff("--- parent\n+++ candidate\n-BM = 256\n+BM = 512\n");
    p.setParentTimeUs(12);
    p.setBestIndex(1);
    p.setBestTimeUs(11);
    p.setReferenceTimeUs(20);
    p.setEvaluations(5);
    p.setBudgetEvals(24);
  }));
  ASSERT_TRUE(d1);
  EXPECT_EQ(d1->seq, 1u);
  EXPECT_EQ(d1->kind, DecisionKind::APPROVE);
  EXPECT_EQ(d1->op, "alice");

  auto d2 = propose(proposal(2));
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->kind, DecisionKind::EDIT);
  ASSERT_EQ(d2->changes.size(), 2u);
  EXPECT_EQ(d2->changes[0], std::make_pair(std::string("bm"), std::string("256")));
  EXPECT_EQ(d2->changes[1], std::make_pair(std::string("order"), std::string("\"kn\"")));

  auto d3 = propose(proposal(3));
  ASSERT_TRUE(d3);
  EXPECT_EQ(d3->kind, DecisionKind::TAKE_OVER);
  EXPECT_EQ(d3->source, "import jax\ndef workload(x):\n    return x\n");

  auto d4 = propose(proposal(4));
  ASSERT_TRUE(d4);
  EXPECT_EQ(d4->kind, DecisionKind::HINT);
  EXPECT_EQ(d4->text, "keep the sum in f32");

  auto d5 = propose(proposal(5));
  ASSERT_TRUE(d5);
  EXPECT_EQ(d5->kind, DecisionKind::HAND_OVER);
  EXPECT_EQ(d5->steps, 2u);

  // Auto's step is a notice: no line is read for it, so `stop` answers #7.
  auto auto_step = proposal(6, 2);
  std::string err;
  auto auto_msg = messages::open_payload<schema::Proposal>(auto_step, err);
  ASSERT_TRUE(auto_msg) << err;
  notify(event([&](auto ev) { ev.setProposal(auto_msg->root<schema::Proposal>()); }));
  auto d7 = propose(proposal(7));
  ASSERT_TRUE(d7);
  EXPECT_EQ(d7->seq, 7u);
  EXPECT_EQ(d7->kind, DecisionKind::STOP);

  // A decision the supervisor took itself (a timeout policy, auto) shows why.
  notify(event([](auto ev) {
    auto d = ev.initDecided();
    d.setSchemaVersion(schema::SCHEMA_VERSION);
    d.setSeq(6);
    d.setOperator("auto");
    d.setText("handed over (1 more)");
  }));
  notify(event([](auto ev) { ev.setEnded("stopped by alice; best vertex 4, 2.00x"); }));
  console.join();
  EXPECT_EQ(console.rc, 0) << console.err.str();
  auto out = console.out.str();
  for (const std::string& line : std::vector<std::string>{
         "welcome: task rmsnorm, mode hitl, chip v6e",
         "error: unknown command 'frobnicate'",
         "error: edit: the value of bm is not JSON: abc",
         "proposal #1: vertex 4 (growBlock {\"bm\":512}) parent 2\n",
         "  task rmsnorm on v6e; evaluations 5/24\n",
         "  rationale: bigger row blocks amortize the per-step overhead\n",
         "  expected: fewer grid steps, ~20% faster\n",
         "  result: correct: all 3 cases pass\n",
         "  time: 10.00 us (modeled); speedup 2.00x vs reference, 1.20x vs parent, 1.10x vs best "
         "(vertex 1)\n",
         "  roofline: 50% (roofline 5.00 us)\n",
         "  diagnosis: memory bound; bottleneck call 0 (rmsnorm_kernel); 5.00 us above roofline\n",
         "    - grow bm: the x tile is 64 KiB of 16 MiB VMEM\n",
         "  diff:\n    --- parent\n    +++ candidate\n    -BM = 256\n    +BM = 512\n",
         "decided #1: approve by alice\n",
         "reject [FEEDBACK...]",  // help
         "decided #2: edit by alice: bm=256 order=\"kn\"\n",
         "error: takeover: cannot read " + std::string(dir_) + "/missing.py",
         "decided #3: takeover by alice: source (3 lines)\n",
         "decided #4: hint by alice: keep the sum in f32\n",
         "error: handover needs a number of steps >= 1",
         "decided #5: handover by alice: 2 steps\n",
         "auto #6: vertex 9 (growBlock {\"bm\":512}) parent 7 (handed over: 2 steps left)\n",
         "decided #6: approve by auto: handed over (1 more)\n",
         "decided #7: stop by alice\n",
         "ended: stopped by alice; best vertex 4, 2.00x\n",
       })
    EXPECT_TRUE(contains(out, line)) << "missing: " << line << "\n--- output ---\n" << out;
  EXPECT_FALSE(contains(out, "decision #")) << "a prompt without a terminal";
  if (getenv("MAXKERNEL_SHOW_CONSOLE"))
    std::cout << out;
  EXPECT_TRUE(status_becomes(0));  // it detached as it left
}

TEST_F(OperatorConsole, EndOfInputDetaches) {
  console_run console(options("bob"), "");
  ASSERT_TRUE(status_becomes(1));
  // The proposal asks for a line; the input has none: the console leaves, the search goes on.
  [[maybe_unused]] auto h = self_->request(gw_, 5s, messages::propose_atom::value, proposal(1));
  console.join();
  EXPECT_EQ(console.rc, 0) << console.err.str();
  EXPECT_TRUE(contains(console.out.str(), "proposal #1: vertex 4"));
  EXPECT_TRUE(contains(console.out.str(), "detached: end of input"));
  EXPECT_TRUE(status_becomes(0));
  notify(event([](auto ev) {
    auto d = ev.initDecided();
    d.setSeq(1);
    d.setOperator("policy");
  }));
}

TEST_F(OperatorConsole, ShowReprintsAndQuitLeaves) {
  console_run console(options("carol"), "show\nquit\napprove\n");
  ASSERT_TRUE(status_becomes(1));
  notify(event([](auto ev) { ev.setNotice("evaluating vertex 3"); }));
  [[maybe_unused]] auto h = self_->request(gw_, 5s, messages::propose_atom::value, proposal(2));
  console.join();
  EXPECT_EQ(console.rc, 0) << console.err.str();
  auto out = console.out.str();
  EXPECT_TRUE(contains(out, "notice: evaluating vertex 3\n")) << out;
  auto first = out.find("proposal #2: vertex 5");
  ASSERT_NE(first, std::string::npos) << out;
  EXPECT_NE(out.find("proposal #2: vertex 5", first + 1), std::string::npos) << out;
  EXPECT_TRUE(contains(out, "\ndetached\n")) << out;
  EXPECT_FALSE(contains(out, "decided #2")) << out;  // quit came before approve
  EXPECT_TRUE(status_becomes(0));
}

// The gateway answers every ping: a console waiting longer than its silence period for a
// proposal stays attached; one whose gateway died (a socket that welcomed it and then said
// nothing more, as a killed process) leaves with exit 3.
TEST_F(OperatorConsole, AGatewayThatFallsSilentIsExitThree) {
  auto o = options("dave");
  o.ping_interval = 50ms;
  o.gateway_silence = 400ms;
  console_run alive(o, "approve\n");
  ASSERT_TRUE(status_becomes(1));
  std::this_thread::sleep_for(1200ms);  // three silence periods with nothing but pongs
  auto d = propose(proposal(1));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, DecisionKind::APPROVE);
  notify(event([](auto ev) { ev.setEnded("done"); }));
  alive.join();
  EXPECT_EQ(alive.rc, 0) << alive.err.str();

  zmq::context_t ctx;
  zmq::socket_t dead(ctx, zmq::socket_type::router);
  std::string endpoint = "ipc://" + dir_ + "/dead.sock";
  dead.bind(endpoint);
  o.endpoint = endpoint;
  console_run console(o, "approve\n");
  zmq::message_t id, frame;
  ASSERT_TRUE(dead.recv(id, zmq::recv_flags::none));
  ASSERT_TRUE(dead.recv(frame, zmq::recv_flags::none));  // attach
  auto welcome = event([](auto ev) { ev.setWelcome("about to die"); });
  dead.send(zmq::buffer(id.to_string()), zmq::send_flags::sndmore);
  dead.send(zmq::buffer(welcome.bytes), zmq::send_flags::none);
  auto started = std::chrono::steady_clock::now();
  console.join();
  EXPECT_EQ(console.rc, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  EXPECT_TRUE(contains(console.err.str(), "stopped answering")) << console.err.str();
  EXPECT_TRUE(contains(console.out.str(), "welcome: about to die")) << console.out.str();
}

TEST_F(OperatorConsole, NoGatewayIsExitThreeNamingTheEndpoint) {
  auto o = options();
  o.endpoint = "ipc://" + dir_ + "/nobody.sock";
  o.connect_timeout_seconds = 0.3;
  console_run console(o, "approve\n");
  console.join();
  EXPECT_EQ(console.rc, 3);
  EXPECT_TRUE(contains(console.err.str(), "no answer from the operator gateway at " + o.endpoint))
    << console.err.str();
  o.endpoint = "smoke-signals://hill";
  console_run bad(o, "");
  bad.join();
  EXPECT_EQ(bad.rc, 2);
  EXPECT_TRUE(contains(bad.err.str(), "smoke-signals://hill")) << bad.err.str();
}

}  // namespace
