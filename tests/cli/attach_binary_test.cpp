// The real `maxkernel attach` binary as an operator: started with a script file as its stdin
// against a real operator gateway in this process; the supervisor's side through a
// scoped_actor. tests/cli/operator_console_test.cpp covers the console in depth.
#include "cluster/operator_gateway.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/operator.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <gtest/gtest.h>

#include <capnp/message.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

using namespace maxkernel;
using namespace std::chrono_literals;
using messages::payload;

namespace {

struct sys_config : caf::actor_system_config {
  sys_config() { messages::register_types(*this); }
};

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the binary with stdin, stdout and stderr on files; waits for its exit (at most 10 s).
class attach_process {
public:
  attach_process(const std::vector<std::string>& args, const std::string& dir,
                 const std::string& script)
    : out_(dir + "/out.txt"), err_(dir + "/err.txt") {
    auto in = dir + "/script.txt";
    std::ofstream(in) << script;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, in.c_str(), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> argv;
    std::string bin = MAXKERNEL_BINARY;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    spawned_ = posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv.data(), environ) == 0;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~attach_process() {
    if (spawned_ && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool spawned() const { return spawned_; }
  // The exit code, or -1 when it did not exit in time.
  int wait() {
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }
  std::string out() const { return read_all(out_); }
  std::string err() const { return read_all(err_); }

private:
  std::string out_, err_;
  pid_t pid_ = 0;
  bool spawned_ = false, reaped_ = false;
};

payload proposal(uint32_t seq) {
  capnp::MallocMessageBuilder msg;
  auto p = msg.initRoot<schema::Proposal>();
  p.setSchemaVersion(schema::SCHEMA_VERSION);
  p.setSeq(seq);
  p.setTask("matmul");
  p.setChip("v5e");
  p.setTiming("measured");
  auto v = p.initVertex();
  v.setIndex(seq);
  v.setParent(0);
  v.setStrategy("swapOrder");
  v.setCorrect(true);
  v.setTimeUs(40);
  return messages::make_payload<schema::Proposal>(msg);
}

class AttachBinary : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/maxkernel-attach-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  sys_config cfg_;
  caf::actor_system sys_{cfg_};
  caf::scoped_actor self_{sys_};
};

TEST_F(AttachBinary, AScriptOnStdinDecidesAndTheEndExitsZero) {
  cluster::operator_gateway_config cfg;
  cfg.endpoint = "ipc://" + dir_ + "/gw.sock";
  cfg.welcome = "task matmul, mode hitl, chip v5e";
  auto gw = cluster::spawn_operator_gateway(sys_, cfg);
  ASSERT_TRUE(gw) << sys_.render(gw.error());
  attach_process proc({"attach", gw->endpoint, "--name", "ci"}, dir_,
                      "approve\nedit bm=oops\nreject meh\n");
  ASSERT_TRUE(proc.spawned());
  std::vector<std::string> seen;
  for (uint32_t seq : {1u, 2u}) {
    self_->request(gw->handle, 10s, messages::propose_atom::value, proposal(seq))
      .receive(
        [&](payload& answer) {
          std::string err;
          auto msg = messages::open_payload<schema::Decision>(answer, err);
          ASSERT_TRUE(msg) << err;
          auto d = msg->root<schema::Decision>();
          EXPECT_EQ(d.getSeq(), seq);
          EXPECT_EQ(std::string(d.getOperator()), "ci");
          seen.push_back(std::to_string(static_cast<int>(d.getKind())) + ":"
                         + std::string(d.getText()));
        },
        [&](caf::error& e) { ADD_FAILURE() << sys_.render(e); });
  }
  EXPECT_EQ(seen, (std::vector<std::string>{
                    std::to_string(static_cast<int>(schema::DecisionKind::APPROVE)) + ":",
                    std::to_string(static_cast<int>(schema::DecisionKind::REJECT)) + ":meh"}));
  capnp::MallocMessageBuilder msg;
  auto ev = msg.initRoot<schema::OperatorEvent>();
  ev.setSchemaVersion(schema::SCHEMA_VERSION);
  ev.setEnded("budget reached");
  caf::anon_send(gw->handle, messages::notify_atom::value,
                 messages::make_payload<schema::OperatorEvent>(msg));
  EXPECT_EQ(proc.wait(), 0) << proc.err();
  auto out = proc.out();
  EXPECT_NE(out.find("welcome: task matmul, mode hitl, chip v5e\n"), std::string::npos) << out;
  EXPECT_NE(out.find("proposal #2: vertex 2 (swapOrder) parent 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  time: 40.00 us (measured)\n"), std::string::npos) << out;
  EXPECT_NE(out.find("decided #1: approve by ci\n"), std::string::npos) << out;
  EXPECT_NE(out.find("error: edit: the value of bm is not JSON: oops"), std::string::npos) << out;
  EXPECT_NE(out.find("decided #2: reject by ci: meh\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ended: budget reached\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("decision #"), std::string::npos) << "no prompt: stdin is not a terminal";
  caf::anon_send_exit(gw->handle, caf::exit_reason::user_shutdown);
}

TEST_F(AttachBinary, NoGatewayExitsThree) {
  auto endpoint = "ipc://" + dir_ + "/nobody.sock";
  attach_process proc({"attach", endpoint, "--connect-timeout", "0.3"}, dir_, "approve\n");
  ASSERT_TRUE(proc.spawned());
  EXPECT_EQ(proc.wait(), 3);
  EXPECT_NE(proc.err().find("no answer from the operator gateway at " + endpoint),
            std::string::npos)
    << proc.err();
}

TEST_F(AttachBinary, ABadCommandLineExitsTwo) {
  attach_process proc({"attach", "--connect-timeout", "-1", "tcp://127.0.0.1:1"}, dir_, "");
  ASSERT_TRUE(proc.spawned());
  EXPECT_EQ(proc.wait(), 2);
}

}  // namespace
