// The LLM planner, implementer and debugger against recorded exchanges: what their prompts
// carry (spec, history, profile, diagnosis, the failing kernel and its error), how replies
// become Plans and Candidates, replies that do not parse sent back with the parse error,
// giving up, and the usage and cost they report.
#include "agents/llm/llm_brains.hpp"
#include "messages/content_hash.hpp"
#include "tests/agents/llm/llm_requests.hpp"
#include "tests/agents/llm/replay_process.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace maxkernel::tests {
namespace {

using messages::error_code;
namespace llm = agents::llm;

class LlmBrains : public ::testing::Test {
protected:
  void SetUp() override { setenv(key_env, key_value, 1); }
  void TearDown() override { unsetenv(key_env); }
};

#define START(server, file)      \
  replay_process server(file);   \
  ASSERT_TRUE(server.started()) << server.error()

std::string body_of(const nlohmann::json& request) { return request["body"].get<std::string>(); }

nlohmann::json messages_of(const nlohmann::json& request) {
  return nlohmann::json::parse(body_of(request))["messages"];
}

TEST_F(LlmBrains, PlannerParsesTheJsonPlanBestFirst) {
  START(server, "plan_from_json.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::PlannerRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  build_spec(req.initSpec());
  build_analysis(req.initAnalysis());
  build_history_entry(req.initHistory(1)[0]);
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto plan = out_msg.initRoot<schema::Plan>();
  auto status = llm::make_llm_planner(replay_config(server))->plan(req.asReader(), plan);
  ASSERT_TRUE(status.ok()) << status.message;

  ASSERT_EQ(plan.getSteps().size(), 2u);
  auto first = plan.getSteps()[0];  // the reply listed it second, with the higher score
  EXPECT_EQ(std::string(first.getMove().cStr()), "grow_block");
  EXPECT_EQ(std::string(first.getParentId().cStr()), history_id);  // prefix a1b2c3d4e5 expanded
  EXPECT_DOUBLE_EQ(first.getScore(), 0.9);
  EXPECT_EQ(std::string(first.getBrain().cStr()), "llm");
  EXPECT_EQ(std::string(first.getTemplate().cStr()), "");
  EXPECT_NE(std::string(first.getInstructions().cStr()).find("bn from 256 to 1024"),
            std::string::npos);
  EXPECT_NE(std::string(first.getRationale().cStr()).find("41%"), std::string::npos);
  EXPECT_NE(std::string(first.getExpectedEffect().cStr()).find("-60%"), std::string::npos);
  ASSERT_EQ(first.getChanges().size(), 1u);
  EXPECT_EQ(std::string(first.getChanges()[0].getName().cStr()), "bn");
  EXPECT_EQ(std::string(first.getChanges()[0].getValue().cStr()), "1024");
  auto second = plan.getSteps()[1];
  EXPECT_EQ(std::string(second.getMove().cStr()), "write_tiled_matmul");
  EXPECT_EQ(std::string(second.getParentId().cStr()), "");
  EXPECT_FALSE(plan.getNoTemplate());

  auto usage = plan.getUsage();
  EXPECT_EQ(usage.getCalls(), 1u);
  EXPECT_EQ(usage.getPromptTokens(), 3000u);
  EXPECT_EQ(usage.getCompletionTokens(), 400u);
  EXPECT_FALSE(usage.getHasCost());  // no prices configured

  // The prompt: Pallas knowledge and the chip in the system message; the task, the history,
  // the best candidate's source and its diagnosis in the user message.
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  auto messages = messages_of(requests[0]);
  std::string system = messages[0]["content"];
  std::string user = messages[1]["content"];
  EXPECT_NE(system.find("dimension_semantics"), std::string::npos);
  EXPECT_NE(system.find("chip: v5e"), std::string::npos);
  EXPECT_NE(system.find("VMEM per core: 128.00 MiB"), std::string::npos) << system;
  EXPECT_NE(user.find("tiled_matmul"), std::string::npos);
  EXPECT_NE(user.find("input x: (256, 512) bfloat16"), std::string::npos) << user;
  EXPECT_NE(user.find("dot_general"), std::string::npos);
  EXPECT_NE(user.find(history_id), std::string::npos);
  EXPECT_NE(user.find("4.20 us modeled"), std::string::npos) << user;
  EXPECT_NE(user.find("growBlock"), std::string::npos) << user;
  EXPECT_NE(user.find("def _kernel(x_ref, w_ref, o_ref, acc_ref)"), std::string::npos);
  EXPECT_NE(user.find("up to 3 steps"), std::string::npos);
  EXPECT_EQ(user.find("{{"), std::string::npos) << "an unfilled placeholder";
}

TEST_F(LlmBrains, PlannerRespectsMaxSteps) {
  START(server, "plan_from_json.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::PlannerRequest>();
  build_spec(req.initSpec());
  build_analysis(req.initAnalysis());
  build_history_entry(req.initHistory(1)[0]);
  req.setChip("v5e");
  req.setMaxSteps(1);
  capnp::MallocMessageBuilder out_msg;
  auto plan = out_msg.initRoot<schema::Plan>();
  ASSERT_TRUE(llm::make_llm_planner(replay_config(server))->plan(req.asReader(), plan).ok());
  ASSERT_EQ(plan.getSteps().size(), 1u);
  EXPECT_EQ(std::string(plan.getSteps()[0].getMove().cStr()), "grow_block");
}

// hitl: the operator's feedback and hints reach the LLM planner's prompt; without any, the
// prompt says nothing of an operator.
TEST_F(LlmBrains, PlannerPromptCarriesTheOperatorsGuidance) {
  for (bool with : {false, true}) {
    START(server, "plan_from_json.json");
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::PlannerRequest>();
    build_spec(req.initSpec());
    build_analysis(req.initAnalysis());
    build_history_entry(req.initHistory(1)[0]);
    req.setChip("v5e");
    if (with) {
      auto g = req.initGuidance(2);
      g.set(0, "the operator rejected vertex 1 (growBlock): too much VMEM");
      g.set(1, "try bf16 inputs with f32 accumulation");
    }
    capnp::MallocMessageBuilder out_msg;
    auto plan = out_msg.initRoot<schema::Plan>();
    ASSERT_TRUE(llm::make_llm_planner(replay_config(server))->plan(req.asReader(), plan).ok());
    auto requests = server.requests();
    std::string user = messages_of(requests.back())[1]["content"];
    EXPECT_EQ(user.find("operator") != std::string::npos, with) << user;
    EXPECT_EQ(user.find("- try bf16 inputs with f32 accumulation") != std::string::npos, with);
    EXPECT_EQ(user.find("too much VMEM") != std::string::npos, with);
  }
}

TEST_F(LlmBrains, ImplementerTurnsTheCodeReplyIntoACandidate) {
  START(server, "code_reply.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::ImplementRequest>();
  build_spec(req.initSpec());
  build_analysis(req.initAnalysis());
  auto step = req.initStep();
  step.setMove("write_tiled_matmul");
  step.setBrain("llm");
  step.setInstructions("Tile (bm, bn, bk) = (256, 256, 512) with an f32 VMEM accumulator.");
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::ImplementReply>();
  auto config = replay_config(server);
  config.prices = config::llm_prices{2.0, 8.0};
  auto status = llm::make_llm_implementer(config)->implement(req.asReader(), reply);
  ASSERT_TRUE(status.ok()) << status.message;

  auto c = reply.getCandidate();
  std::string source = c.getSource().cStr();
  EXPECT_EQ(source, exchange_file("matmul.py"));
  EXPECT_EQ(std::string(c.getId().cStr()), messages::sha256_hex(source));
  EXPECT_EQ(std::string(c.getOrigin().cStr()), "llm:replay-model");
  EXPECT_EQ(std::string(c.getTemplate().cStr()), "");
  EXPECT_EQ(std::string(c.getParentId().cStr()), "");
  EXPECT_EQ(std::string(c.getStrategy().cStr()), "write_tiled_matmul");
  EXPECT_EQ(c.getSchemaVersion(), schema::SCHEMA_VERSION);

  auto u = reply.getUsage();
  EXPECT_EQ(u.getCalls(), 1u);
  EXPECT_EQ(u.getPromptTokens(), 2500u);
  EXPECT_EQ(u.getCompletionTokens(), 900u);
  EXPECT_TRUE(u.getHasCost());
  EXPECT_NEAR(u.getCostUsd(), (2500 * 2.0 + 900 * 8.0) / 1e6, 1e-12);
}

TEST_F(LlmBrains, CodeThatDoesNotParseIsSentBackWithTheParseError) {
  START(server, "unparsable_code_retried.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::ImplementRequest>();
  build_spec(req.initSpec());
  build_analysis(req.initAnalysis());
  req.initStep().setMove("write_tiled_matmul");
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::ImplementReply>();
  auto config = replay_config(server);
  config.prices = config::llm_prices{1.25, 10.0};
  auto status = llm::make_llm_implementer(config)->implement(req.asReader(), reply);
  ASSERT_TRUE(status.ok()) << status.message;
  EXPECT_EQ(std::string(reply.getCandidate().getSource().cStr()), exchange_file("matmul.py"));

  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1]["mismatch"], nullptr);
  auto second = messages_of(requests[1]);
  ASSERT_EQ(second.size(), 4u);  // system, user, the rejected reply, the parse error
  EXPECT_EQ(second[2]["role"], "assistant");
  EXPECT_NE(second[2]["content"].get<std::string>().find("in_specs=["), std::string::npos);
  EXPECT_EQ(second[3]["role"], "user");
  std::string rejection = second[3]["content"];
  EXPECT_NE(rejection.find("Your reply could not be used"), std::string::npos);
  EXPECT_NE(rejection.find("the code does not parse: line"), std::string::npos) << rejection;
  EXPECT_NE(rejection.find("is never closed"), std::string::npos) << rejection;
  EXPECT_EQ(messages_of(requests[0]), nlohmann::json(std::vector<nlohmann::json>(
                                          second.begin(), second.begin() + 2)));

  // Both calls are counted, and the cost of both.
  auto u = reply.getUsage();
  EXPECT_EQ(u.getCalls(), 2u);
  EXPECT_EQ(u.getPromptTokens(), 2500u + 3400u);
  EXPECT_EQ(u.getCompletionTokens(), 700u + 900u);
  EXPECT_NEAR(u.getCostUsd(), (5900 * 1.25 + 1600 * 10.0) / 1e6, 1e-12);
}

TEST_F(LlmBrains, RepliesThatNeverParseEndInServiceUnavailable) {
  START(server, "never_parses.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::ImplementRequest>();
  build_spec(req.initSpec());
  build_analysis(req.initAnalysis());
  req.initStep().setMove("write_tiled_matmul");
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::ImplementReply>();
  auto status = llm::make_llm_implementer(replay_config(server))->implement(req.asReader(), reply);
  EXPECT_EQ(status.code, error_code::service_unavailable);
  EXPECT_NE(status.message.find("no usable reply in 3 attempts"), std::string::npos)
      << status.message;
  EXPECT_NE(status.message.find("no ```python code block"), std::string::npos) << status.message;
  EXPECT_EQ(server.requests().size(), 3u);
  for (const auto& r : server.requests())
    EXPECT_EQ(r["mismatch"], nullptr);
  // The tokens spent are reported even though the brain failed.
  EXPECT_EQ(reply.getUsage().getCalls(), 3u);
  EXPECT_EQ(reply.getUsage().getPromptTokens(), 3000u);
}

TEST_F(LlmBrains, DebuggerRepairsAKernelThatFailedToLower) {
  START(server, "repair.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::DebugRequest>();
  build_spec(req.initSpec());
  build_analysis(req.initAnalysis());
  std::string failing = exchange_file("misaligned.py");
  std::string failing_id = messages::sha256_hex(failing);
  build_candidate(req.initCandidate(), failing_id, failing);
  build_lowering_failure(req.initResult(), failing_id);
  req.setAttempt(1);
  req.setMaxAttempts(3);
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::DebugReply>();
  auto status = llm::make_llm_debugger(replay_config(server))->debug(req.asReader(), reply);
  ASSERT_TRUE(status.ok()) << status.message;

  EXPECT_TRUE(reply.getRepaired());
  auto c = reply.getCandidate();
  EXPECT_EQ(std::string(c.getSource().cStr()), exchange_file("repaired.py"));
  EXPECT_EQ(std::string(c.getId().cStr()), messages::sha256_hex(exchange_file("repaired.py")));
  EXPECT_EQ(std::string(c.getParentId().cStr()), failing_id);
  EXPECT_EQ(std::string(c.getOrigin().cStr()), "llm:replay-model");
  std::string fix = reply.getFix().cStr();
  EXPECT_NE(fix.find("_pick(m, 128, 8)"), std::string::npos) << fix;
  EXPECT_EQ(std::string(c.getStrategy().cStr()), "repair: " + fix);
  EXPECT_NE(std::string(reply.getReason().cStr()).find("not a multiple of 8"), std::string::npos);
  EXPECT_EQ(reply.getUsage().getCalls(), 1u);
  EXPECT_EQ(reply.getUsage().getCompletionTokens(), 950u);

  // The request carried the failing source and the lowering error with its class.
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0]["mismatch"], nullptr);
  std::string user = messages_of(requests[0])[1]["content"];
  EXPECT_NE(user.find("Phase lower failed (lowerBlockShape)"), std::string::npos) << user;
  EXPECT_NE(user.find("divisible by 8 and 128"), std::string::npos);
  EXPECT_NE(user.find("attempt 1 of 3"), std::string::npos);
}

TEST_F(LlmBrains, DebuggerMayGiveUp) {
  START(server, "give_up.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::DebugRequest>();
  build_spec(req.initSpec());
  build_analysis(req.initAnalysis());
  std::string source = exchange_file("matmul.py");
  build_candidate(req.initCandidate(), messages::sha256_hex(source), source);
  auto r = req.initResult();
  r.setCorrect(false);
  auto phase = r.initPhases(1)[0];
  phase.setPhase(schema::Phase::TEST);
  phase.setStatus(schema::Status::FAILED);
  phase.setErrorClass(schema::ErrorClass::MISMATCH);
  phase.setMessage("output 0: max abs error 3.1 > atol 0.01");
  req.setAttempt(2);
  req.setMaxAttempts(3);
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::DebugReply>();
  auto status = llm::make_llm_debugger(replay_config(server))->debug(req.asReader(), reply);
  ASSERT_TRUE(status.ok()) << status.message;
  EXPECT_FALSE(reply.getRepaired());
  EXPECT_NE(std::string(reply.getReason().cStr()).find("a sort has no lowering"),
            std::string::npos);
  EXPECT_EQ(reply.getUsage().getCalls(), 1u);
}

TEST_F(LlmBrains, DebuggerPastMaxAttemptsAsksNothing) {
  START(server, "give_up.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::DebugRequest>();
  build_spec(req.initSpec());
  req.setAttempt(4);
  req.setMaxAttempts(3);
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::DebugReply>();
  ASSERT_TRUE(llm::make_llm_debugger(replay_config(server))->debug(req.asReader(), reply).ok());
  EXPECT_FALSE(reply.getRepaired());
  EXPECT_NE(std::string(reply.getReason().cStr()).find("after 3 attempts"), std::string::npos);
  EXPECT_TRUE(server.requests().empty());
  EXPECT_EQ(reply.getUsage().getCalls(), 0u);
}

TEST_F(LlmBrains, MissingKeyVariableFailsTheBrainClearly) {
  START(server, "code_reply.json");
  unsetenv(key_env);
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::ImplementRequest>();
  build_spec(req.initSpec());
  req.initStep().setMove("write_tiled_matmul");
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::ImplementReply>();
  auto status = llm::make_llm_implementer(replay_config(server))->implement(req.asReader(), reply);
  EXPECT_EQ(status.code, error_code::service_unavailable);
  EXPECT_NE(status.message.find(std::string(key_env) + " (llm.api_key_env) is not set"),
            std::string::npos)
      << status.message;
  EXPECT_TRUE(server.requests().empty());
}

TEST_F(LlmBrains, UnknownChipIsBadInput) {
  START(server, "code_reply.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::ImplementRequest>();
  build_spec(req.initSpec());
  req.initStep().setMove("write_tiled_matmul");
  req.setChip("v99");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::ImplementReply>();
  auto status = llm::make_llm_implementer(replay_config(server))->implement(req.asReader(), reply);
  EXPECT_EQ(status.code, error_code::bad_input);
  EXPECT_NE(status.message.find("v99"), std::string::npos) << status.message;
  EXPECT_TRUE(server.requests().empty());
}

TEST_F(LlmBrains, StepNamingAParentWithoutOneIsBadInput) {
  START(server, "code_reply.json");
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::ImplementRequest>();
  build_spec(req.initSpec());
  req.initStep().setParentId(history_id);
  req.setChip("v5e");
  capnp::MallocMessageBuilder out_msg;
  auto reply = out_msg.initRoot<schema::ImplementReply>();
  auto status = llm::make_llm_implementer(replay_config(server))->implement(req.asReader(), reply);
  EXPECT_EQ(status.code, error_code::bad_input);
  EXPECT_TRUE(server.requests().empty());
}

}  // namespace
}  // namespace maxkernel::tests
