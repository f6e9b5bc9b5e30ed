// The operator's typed lines: what each command becomes, and a clear error (naming the
// field or file) for every bad line.
#include "cli/operator_command.hpp"
#include "maxkernel/schema/operator.capnp.h"
#include "messages/capnp_io.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

using namespace maxkernel;
using cli::operator_command;
using cli::parse_operator_command;
using schema::DecisionKind;

namespace {

std::string error_of(const std::string& line) {
  auto p = parse_operator_command(line);
  EXPECT_FALSE(p.ok) << line;
  return p.error;
}

operator_command ok(const std::string& line) {
  auto p = parse_operator_command(line);
  EXPECT_TRUE(p.ok) << line << ": " << p.error;
  return p.command;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(OperatorCommand, SimpleDecisions) {
  auto a = ok("  approve ");
  EXPECT_EQ(a.what, operator_command::action::decide);
  EXPECT_EQ(a.kind, DecisionKind::APPROVE);
  auto r = ok("reject too slow: try   bigger blocks");
  EXPECT_EQ(r.kind, DecisionKind::REJECT);
  EXPECT_EQ(r.text, "too slow: try   bigger blocks");
  EXPECT_EQ(ok("reject").text, "");  // feedback is optional
  auto h = ok("hint keep the reduction in f32");
  EXPECT_EQ(h.kind, DecisionKind::HINT);
  EXPECT_EQ(h.text, "keep the reduction in f32");
  auto ho = ok("handover 3");
  EXPECT_EQ(ho.kind, DecisionKind::HAND_OVER);
  EXPECT_EQ(ho.steps, 3u);
  EXPECT_EQ(ok("stop").kind, DecisionKind::STOP);
}

TEST(OperatorCommand, LocalCommandsAndBlankLines) {
  EXPECT_EQ(ok("show").what, operator_command::action::show);
  EXPECT_EQ(ok("help").what, operator_command::action::help);
  EXPECT_EQ(ok("quit").what, operator_command::action::quit);
  EXPECT_EQ(ok("detach").what, operator_command::action::quit);
  EXPECT_EQ(ok("release").what, operator_command::action::release);
  EXPECT_EQ(ok("").what, operator_command::action::none);
  EXPECT_EQ(ok("   # a comment in a script").what, operator_command::action::none);
}

TEST(OperatorCommand, EditTakesJsonLiterals) {
  auto e = ok(R"(edit bm=256 "order"="\"kn\"" tile='[128, 256]' fuse=true)");
  EXPECT_EQ(e.kind, DecisionKind::EDIT);
  ASSERT_EQ(e.changes.size(), 4u);
  EXPECT_EQ(e.changes[0], std::make_pair(std::string("bm"), std::string("256")));
  EXPECT_EQ(e.changes[1], std::make_pair(std::string("order"), std::string("\"kn\"")));
  EXPECT_EQ(e.changes[2], std::make_pair(std::string("tile"), std::string("[128, 256]")));
  EXPECT_EQ(e.changes[3], std::make_pair(std::string("fuse"), std::string("true")));
  EXPECT_TRUE(e.source.empty());
}

TEST(OperatorCommand, BadEditsNameTheField) {
  auto e = error_of("edit bm=256 order=kn");
  EXPECT_TRUE(contains(e, "value of order is not JSON: kn")) << e;
  e = error_of("edit bm=");
  EXPECT_TRUE(contains(e, "value of bm")) << e;
  e = error_of("edit bm");
  EXPECT_TRUE(contains(e, "'bm' is not NAME=JSON")) << e;
  e = error_of("edit =3");
  EXPECT_TRUE(contains(e, "not NAME=JSON")) << e;
  e = error_of("edit bm=1 bm=2");
  EXPECT_TRUE(contains(e, "bm is given twice")) << e;
  e = error_of("edit");
  EXPECT_TRUE(contains(e, "edit needs NAME=JSON")) << e;
  e = error_of("edit order='\"kn");
  EXPECT_TRUE(contains(e, "unterminated")) << e;
}

TEST(OperatorCommand, BadLinesSayWhatIsWrong) {
  EXPECT_TRUE(contains(error_of("frobnicate now"), "unknown command 'frobnicate'"));
  EXPECT_TRUE(contains(error_of("approve it"), "approve takes no arguments"));
  EXPECT_TRUE(contains(error_of("stop now"), "stop takes no arguments"));
  EXPECT_TRUE(contains(error_of("hint"), "hint needs a text"));
  EXPECT_TRUE(contains(error_of("handover"), "handover needs a number of steps"));
  EXPECT_TRUE(contains(error_of("handover 0"), "steps >= 1"));
  EXPECT_TRUE(contains(error_of("handover -2"), "got '-2'"));
  EXPECT_TRUE(contains(error_of("handover 3x"), "got '3x'"));
  EXPECT_TRUE(contains(error_of("handover 99999999999"), "steps"));
  EXPECT_TRUE(contains(error_of("takeover"), "takeover needs one FILE"));
  EXPECT_TRUE(contains(error_of("edit-source a.py b.py"), "edit-source needs one FILE"));
}

class OperatorCommandFiles : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/maxkernel-opcmd-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    auto path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(OperatorCommandFiles, TakeoverAndEditSourceReadTheModule) {
  const std::string module = "import jax\n\ndef workload(x):\n    return x * 2\n";
  auto path = write("my kernel.py", module);
  auto t = ok("takeover '" + path + "'");
  EXPECT_EQ(t.kind, DecisionKind::TAKE_OVER);
  EXPECT_EQ(t.source, module);
  EXPECT_EQ(t.source_file, path);
  auto e = ok("edit-source \"" + path + "\"");
  EXPECT_EQ(e.kind, DecisionKind::EDIT);
  EXPECT_EQ(e.source, module);
  EXPECT_TRUE(e.changes.empty());
}

TEST_F(OperatorCommandFiles, UnreadableFilesAreNamed) {
  auto missing = dir_ + "/missing.py";
  auto e = error_of("takeover " + missing);
  EXPECT_TRUE(contains(e, "cannot read " + missing)) << e;
  e = error_of("edit-source " + dir_);
  EXPECT_TRUE(contains(e, dir_ + ": it is a directory")) << e;
  auto empty = write("empty.py", "  \n");
  e = error_of("takeover " + empty);
  EXPECT_TRUE(contains(e, empty + " is empty")) << e;
}

TEST(OperatorCommand, EncodesTheDecisionForTheWaitingProposal) {
  auto cmd = ok("edit bm=512 order='\"nk\"'");
  auto bytes = cli::encode_decision(cmd, 7);
  std::string err;
  auto msg = messages::decode<schema::OperatorCommand>(bytes, err);
  ASSERT_TRUE(msg) << err;
  auto root = msg->root<schema::OperatorCommand>();
  ASSERT_TRUE(root.isDecision());
  auto d = root.getDecision();
  EXPECT_EQ(d.getSeq(), 7u);
  EXPECT_EQ(d.getKind(), DecisionKind::EDIT);
  ASSERT_EQ(d.getChanges().size(), 2u);
  EXPECT_EQ(std::string(d.getChanges()[1].getName()), "order");
  EXPECT_EQ(std::string(d.getChanges()[1].getValue()), "\"nk\"");
  auto h = cli::encode_decision(ok("handover 4"), 2);
  msg = messages::decode<schema::OperatorCommand>(h, err);
  ASSERT_TRUE(msg) << err;
  EXPECT_EQ(msg->root<schema::OperatorCommand>().getDecision().getSteps(), 4u);
  EXPECT_EQ(msg->root<schema::OperatorCommand>().getDecision().getKind(), DecisionKind::HAND_OVER);
}

}  // namespace
