// Parsing the models' replies: plans as JSON in their usual wrappings, code blocks, repairs,
// and the errors that go back to the model (they must say what is wrong).
#include "agents/llm/code_reply.hpp"
#include "agents/llm/plan_reply.hpp"

#include <gtest/gtest.h>

namespace maxkernel::agents::llm {
namespace {

const char* step_json = R"({"move": "grow_block", "parent": null, "rationale": "r",
  "expected_effect": "e", "instructions": "i", "score": 0.5})";

const std::string kernel = "import jax\nfrom jax.experimental import pallas as pl\n\n"
                           "def workload(x):\n    return pl.pallas_call(k, out_shape=x)(x)\n";

std::vector<planned_step> plan_ok(const std::string& reply, std::vector<std::string> ids = {}) {
  std::vector<planned_step> steps;
  std::string error;
  EXPECT_TRUE(parse_plan_reply(reply, ids, steps, error)) << error << "\n" << reply;
  return steps;
}

std::string plan_error(const std::string& reply, std::vector<std::string> ids = {}) {
  std::vector<planned_step> steps;
  std::string error;
  EXPECT_FALSE(parse_plan_reply(reply, ids, steps, error)) << reply;
  return error;
}

TEST(PlanReply, AcceptsTheUsualWrappings) {
  std::string list = std::string("[") + step_json + "]";
  EXPECT_EQ(plan_ok(list).size(), 1u);
  EXPECT_EQ(plan_ok("```json\n" + list + "\n```").size(), 1u);
  EXPECT_EQ(plan_ok("Here is the plan:\n```json\n" + list + "\n```\nGood luck.").size(), 1u);
  EXPECT_EQ(plan_ok("```\n" + list + "\n```").size(), 1u);
  EXPECT_EQ(plan_ok(std::string(R"({"steps": [)") + step_json + "," + step_json + "]}").size(),
            2u);
  EXPECT_EQ(plan_ok("Plan: " + list + " (end)").size(), 1u);
  EXPECT_EQ(plan_ok("<think>maybe {x} or [y]</think>\n" + list).size(), 1u);
  EXPECT_EQ(plan_ok(step_json).size(), 1u);  // one step on its own
}

TEST(PlanReply, ReadsEveryField) {
  auto steps = plan_ok(R"([{"move": "reorder_grid", "parent": "0123456789ab",
    "rationale": " x re-read ", "expected_effect": "-30% HBM", "instructions": "swap i, j",
    "score": 2, "changes": {"bm": 512, "order": "jik"}, "extra": "ignored"}])",
                       {"0123456789abcdef"});
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].move, "reorder_grid");
  EXPECT_EQ(steps[0].parent_id, "0123456789abcdef");
  EXPECT_EQ(steps[0].rationale, "x re-read");
  EXPECT_EQ(steps[0].expected_effect, "-30% HBM");
  EXPECT_EQ(steps[0].instructions, "swap i, j");
  EXPECT_DOUBLE_EQ(steps[0].score, 2);
  ASSERT_EQ(steps[0].changes.size(), 2u);
  EXPECT_EQ(steps[0].changes[0], (std::pair<std::string, std::string>{"bm", "512"}));
  EXPECT_EQ(steps[0].changes[1], (std::pair<std::string, std::string>{"order", "\"jik\""}));
}

TEST(PlanReply, ErrorsNameTheStepAndFieldAndTheFormat) {
  auto e = plan_error(R"([{"move": "m", "rationale": "r", "expected_effect": "e", "score": 1}])");
  EXPECT_NE(e.find("steps[0]: the field \"instructions\" is missing"), std::string::npos) << e;
  EXPECT_NE(e.find("Expected a JSON list of steps"), std::string::npos) << e;
  e = plan_error(std::string("[") + step_json + R"(, {"move": "m", "rationale": "r",
    "expected_effect": "e", "instructions": "i", "score": "high"}])");
  EXPECT_NE(e.find("steps[1].score: expected a number"), std::string::npos) << e;
  e = plan_error(R"([{"move": 3, "rationale": "r", "expected_effect": "e", "instructions": "i",
    "score": 1}])");
  EXPECT_NE(e.find("steps[0].move: expected a string"), std::string::npos) << e;
  e = plan_error("[]");
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  e = plan_error("I think you should grow the blocks.");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  e = plan_error("```json\n[{\"move\": \"m\",]\n```");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("parse error"), std::string::npos) << e;  // nlohmann's position
}

TEST(PlanReply, ParentsMustBeHistoryCandidates) {
  auto step = [](const std::string& parent) {
    return R"([{"move": "m", "parent": ")" + parent +
           R"(", "rationale": "r", "expected_effect": "e", "instructions": "i", "score": 1}])";
  };
  std::vector<std::string> ids{"aaaaaaaa11111111", "aaaaaaaa22222222", "bbbbbbbb33333333"};
  EXPECT_EQ(plan_ok(step("bbbbbbbb"), ids)[0].parent_id, "bbbbbbbb33333333");
  EXPECT_EQ(plan_ok(step("aaaaaaaa22222222"), ids)[0].parent_id, "aaaaaaaa22222222");
  EXPECT_NE(plan_error(step("aaaaaaaa"), ids).find("matches several"), std::string::npos);
  EXPECT_NE(plan_error(step("bbbb"), ids).find("is not the id of a candidate"),
            std::string::npos);  // too short a prefix
  EXPECT_NE(plan_error(step("cccccccc"), ids).find("is not the id"), std::string::npos);
  EXPECT_NE(plan_error(step("cccccccc"), {}).find("the history is empty"), std::string::npos);
  EXPECT_EQ(plan_ok(step(""), ids)[0].parent_id, "");
}

code_reply code_ok(const std::string& reply, const std::string& finish = "stop") {
  code_reply out;
  std::string error;
  EXPECT_TRUE(parse_code_reply(reply, finish, out, error)) << error << "\n" << reply;
  return out;
}

std::string code_error(const std::string& reply, const std::string& finish = "stop") {
  code_reply out;
  std::string error;
  EXPECT_FALSE(parse_code_reply(reply, finish, out, error)) << reply;
  return error;
}

TEST(CodeReply, TakesTheBlockThatDefinesWorkload) {
  auto r = code_ok("I tile it.\n```python\n" + kernel + "```\nDone.");
  EXPECT_EQ(r.source, kernel);
  EXPECT_EQ(r.prose, "I tile it.\nDone.");
  // A fragment first, then the module: the module wins.
  r = code_ok("Change:\n```python\nbm = 512\n```\nModule:\n```py\n" + kernel + "```");
  EXPECT_EQ(r.source, kernel);
  // A docstring holding ``` stays inside the code.
  std::string with_doc = "from jax.experimental import pallas as pl\n"
                         "def workload(x):\n    \"\"\"Example:\n    ```python\n    y\n"
                         "    \"\"\"\n    return x\n";
  EXPECT_EQ(code_ok("```python\n" + with_doc + "```").source, with_doc);
  // Untagged fences and a missing final newline.
  EXPECT_EQ(code_ok("```\n" + kernel.substr(0, kernel.size() - 1) + "\n```").source, kernel);
}

TEST(CodeReply, RefusesWithAReasonTheModelCanAct) {
  EXPECT_NE(code_error("Use 512x512 blocks.").find("no ```python code block"), std::string::npos);
  EXPECT_NE(code_error("```python\nimport jax\nx = 1\n```").find("defines `workload`"),
            std::string::npos);
  EXPECT_NE(code_error("```python\nclass A:\n    def workload(self): pass\n```")
                .find("defines `workload`"),
            std::string::npos);  // not at the top level
  auto e = code_error("```python\n" + kernel, "length");
  EXPECT_NE(e.find("never closed"), std::string::npos) << e;
  EXPECT_NE(e.find("finish_reason: length"), std::string::npos) << e;
  e = code_error("```python\nfrom jax.experimental import pallas as pl\n"
                 "def workload(x):\n    return pl.pallas_call(k, interpret=True)(x)\n```");
  EXPECT_NE(e.find("interpret=True"), std::string::npos) << e;
  e = code_error("```python\nfrom jax.experimental.pallas import tpu as pltpu\n"
                 "def workload(x):\n    with pltpu.force_tpu_interpret_mode():\n"
                 "        return x\n```");
  EXPECT_NE(e.find("force_tpu_interpret_mode"), std::string::npos) << e;
  e = code_error("```python\nimport jax.numpy as jnp\ndef workload(x):\n    return x @ x\n```");
  EXPECT_NE(e.find("does not use Pallas"), std::string::npos) << e;
  e = code_error("```python\nfrom jax.experimental import pallas as pl\n"
                 "def workload(x):\n    return pl.pallas_call(k,\n        out_shape=x\n```");
  EXPECT_NE(e.find("the code does not parse: line 3: '(' is never closed"), std::string::npos)
      << e;
}

TEST(UnbalancedPython, SkipsStringsAndComments) {
  EXPECT_EQ(unbalanced_python("x = (1, [2, {3: 4}])\n"), std::nullopt);
  EXPECT_EQ(unbalanced_python("s = ')]}'  # ((( \nt = \"(\"\n"), std::nullopt);
  EXPECT_EQ(unbalanced_python("d = \"\"\"\n  ( unclosed in a docstring\n\"\"\"\n"), std::nullopt);
  EXPECT_EQ(unbalanced_python("s = 'it\\'s ('\n"), std::nullopt);
  EXPECT_EQ(unbalanced_python("f(a,\n  b)\n"), std::nullopt);
  EXPECT_EQ(unbalanced_python("x = (1]\n").value_or(""),
            "line 1: ']' does not match the '(' opened at line 1");
  EXPECT_EQ(unbalanced_python("x = 1\n)\n").value_or(""), "line 2: ')' closes nothing");
  EXPECT_EQ(unbalanced_python("x = [\n1,\n").value_or(""),
            "line 1: '[' is never closed (the code ends at line 3)");
  EXPECT_EQ(unbalanced_python("x = 1\n'''doc\n").value_or(""),
            "line 2: a triple-quoted string (''') is never closed");
}

TEST(RepairReply, ReadsCauseFixAndCode) {
  repair_reply r;
  std::string error;
  ASSERT_TRUE(parse_repair_reply("**Cause:** bm=100 breaks the (8,128) rule.\nFix: bm = 128.\n\n"
                                 "```python\n" + kernel + "```\n",
                                 "stop", r, error))
      << error;
  EXPECT_FALSE(r.gave_up);
  EXPECT_EQ(r.cause, "bm=100 breaks the (8,128) rule.");
  EXPECT_EQ(r.fix, "bm = 128.");
  EXPECT_EQ(r.source, kernel);
}

TEST(RepairReply, GiveUpWithoutCode) {
  repair_reply r;
  std::string error;
  ASSERT_TRUE(parse_repair_reply("GIVE UP: sorting has no TPU lowering.", "stop", r, error));
  EXPECT_TRUE(r.gave_up);
  EXPECT_EQ(r.reason, "sorting has no TPU lowering.");
  // A "give up" next to a full module is a repair (the module is what counts).
  ASSERT_TRUE(parse_repair_reply("Give up: maybe.\n```python\n" + kernel + "```", "stop", r,
                                 error));
  EXPECT_FALSE(r.gave_up);
}

TEST(RepairReply, NoCodeAndNoGiveUpSaysBoth) {
  repair_reply r;
  std::string error;
  ASSERT_FALSE(parse_repair_reply("Cause: misaligned.\nFix: align.", "stop", r, error));
  EXPECT_NE(error.find("no ```python code block"), std::string::npos) << error;
  EXPECT_NE(error.find("GIVE UP"), std::string::npos) << error;
}

}  // namespace
}  // namespace maxkernel::agents::llm
