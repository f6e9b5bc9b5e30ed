// The embedded prompts and their strict placeholder filling: each prompt file takes exactly
// the values the brains give it, and a missing or unused value is an error, not a hole.
#include "agents/llm/prompt_text.hpp"

#include <gtest/gtest.h>

#include <set>

namespace maxkernel::agents::llm {
namespace {

std::map<std::string, std::string> values_for(std::initializer_list<const char*> names) {
  std::map<std::string, std::string> v;
  for (const char* n : names)
    v[n] = std::string("<") + n + ">";
  return v;
}

TEST(PromptText, EveryPromptIsEmbedded) {
  const auto& p = embedded_prompts();
  for (const char* f :
       {"pallas_tpu.md", "planner.md", "implementer.md", "debugger.md", "reply_rejected.md"})
    EXPECT_TRUE(p.count(f)) << f;
}

// The names the brains pass (agents/llm/llm_brains.cpp, conversation.cpp).
TEST(PromptText, EachPromptTakesTheBrainsValues) {
  const std::map<std::string, std::map<std::string, std::string>> uses{
      {"pallas_tpu.md", values_for({"chip"})},
      {"planner.md", values_for({"spec", "analysis", "history", "best", "profile", "diagnosis",
                                 "max_steps"})},
      {"implementer.md", values_for({"spec", "analysis", "step", "parent_source"})},
      {"debugger.md", values_for({"spec", "analysis", "source", "error", "attempt", "tried"})},
      {"reply_rejected.md", values_for({"error"})},
  };
  for (const auto& [file, values] : uses) {
    std::string out, error;
    ASSERT_TRUE(fill_prompt(file, values, out, error)) << error;
    EXPECT_EQ(out.find("{{"), std::string::npos) << file;
    for (const auto& [k, v] : values)
      EXPECT_NE(out.find(v), std::string::npos) << file << " " << k;
  }
}

TEST(PromptText, PallasKnowledgeIsThere) {
  const std::string& t = embedded_prompts().at("pallas_tpu.md");
  for (const char* fact : {"BlockSpec", "(8, 128)", "vmem_limit_bytes", "dimension_semantics",
                           "PrefetchScalarGridSpec", "pl.when", "pltpu.VMEM", "interpret",
                           "workload(*inputs)", "reduced sizes"})
    EXPECT_NE(t.find(fact), std::string::npos) << fact;
}

TEST(PromptText, FillingIsStrict) {
  std::string out, error;
  EXPECT_TRUE(fill_placeholders("t", "a {{x}} b {{x}} c", {{"x", "1"}}, out, error));
  EXPECT_EQ(out, "a 1 b 1 c");
  EXPECT_FALSE(fill_placeholders("t", "a {{x}} {{y}}", {{"x", "1"}}, out, error));
  EXPECT_NE(error.find("no value for placeholder {{y}}"), std::string::npos) << error;
  EXPECT_FALSE(fill_placeholders("t", "a {{x}}", {{"x", "1"}, {"z", "2"}}, out, error));
  EXPECT_NE(error.find("value z has no placeholder"), std::string::npos) << error;
  EXPECT_FALSE(fill_placeholders("t", "a {{x", {{"x", "1"}}, out, error));
  EXPECT_NE(error.find("unterminated"), std::string::npos) << error;
  EXPECT_FALSE(fill_placeholders("t", "d = {{'a': 1}}", {}, out, error));
  EXPECT_NE(error.find("not a placeholder name"), std::string::npos) << error;
  EXPECT_FALSE(fill_prompt("nope.md", {}, out, error));
}

TEST(PromptText, ValuesAreNotScannedAgain) {
  std::string out, error;
  ASSERT_TRUE(fill_placeholders("t", "[{{code}}]", {{"code", "f'{{x}}'"}}, out, error)) << error;
  EXPECT_EQ(out, "[f'{{x}}']");
}

}  // namespace
}  // namespace maxkernel::agents::llm
