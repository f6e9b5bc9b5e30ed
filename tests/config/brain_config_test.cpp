// Brain config files: the defaults, chains, the llm section with its defaults and limits, every
// file in bad_brains/ failing with its field and line, and the examples of docs/brains.md.
#include "config/brain_config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace maxkernel::config::test {
namespace {

namespace fs = std::filesystem;
using K = brain_kind;

brain_config parse_ok(const std::string& text) {
  brain_config c;
  spec_error e;
  EXPECT_TRUE(parse_brain_config(text, "brains.yaml", c, e)) << e.what();
  return c;
}

spec_error parse_bad(const std::string& text) {
  brain_config c;
  spec_error e;
  EXPECT_FALSE(parse_brain_config(text, "brains.yaml", c, e)) << text;
  return e;
}

const char* full_llm = R"(
llm:
  base_url: https://generativelanguage.googleapis.com/v1beta/openai/
  model: gemini-2.5-pro
  api_key_env: GEMINI_API_KEY
  temperature: 0.7
  max_tokens: 16384
  timeout_seconds: 90
  retries: 5
  backoff_seconds: 0.5
  prices:
    prompt: 1.25
    completion: 10
)";

TEST(BrainConfig, DefaultsAreExpertEverywhereWithoutLlm) {
  auto c = default_brain_config();
  EXPECT_EQ(c.planner, std::vector<K>{K::expert});
  EXPECT_EQ(c.implementer, std::vector<K>{K::expert});
  EXPECT_EQ(c.debugger, std::vector<K>{K::expert});
  EXPECT_FALSE(c.llm.has_value());
  EXPECT_EQ(c.source_path, "");
}

TEST(BrainConfig, EmptyFileAndCommentsGiveTheDefaults) {
  for (const char* text : {"", "# nothing configured yet\n"}) {
    auto c = parse_ok(text);
    EXPECT_EQ(c.planner, std::vector<K>{K::expert});
    EXPECT_FALSE(c.llm.has_value());
    EXPECT_EQ(c.source_path, "brains.yaml");
  }
}

TEST(BrainConfig, ChainsAreOneBrainOrAnOrderedList) {
  auto c = parse_ok(std::string("planner: [expert, llm]\nimplementer: llm\n") + full_llm);
  EXPECT_EQ(c.planner, (std::vector<K>{K::expert, K::llm}));
  EXPECT_EQ(c.implementer, std::vector<K>{K::llm});
  EXPECT_EQ(c.debugger, std::vector<K>{K::expert});  // unset: the default
  c = parse_ok(std::string("debugger: [llm, expert]\n") + full_llm);
  EXPECT_EQ(c.debugger, (std::vector<K>{K::llm, K::expert}));
}

TEST(BrainConfig, LlmSectionIsReadWithEveryField) {
  auto c = parse_ok(std::string("planner: llm\n") + full_llm);
  ASSERT_TRUE(c.llm.has_value());
  const llm_config& l = *c.llm;
  EXPECT_EQ(l.base_url, "https://generativelanguage.googleapis.com/v1beta/openai");  // no '/'
  EXPECT_EQ(l.model, "gemini-2.5-pro");
  EXPECT_EQ(l.api_key_env, "GEMINI_API_KEY");
  EXPECT_DOUBLE_EQ(l.temperature, 0.7);
  EXPECT_EQ(l.max_tokens, 16384u);
  EXPECT_DOUBLE_EQ(l.timeout_seconds, 90);
  EXPECT_EQ(l.retries, 5u);
  EXPECT_DOUBLE_EQ(l.backoff_seconds, 0.5);
  ASSERT_TRUE(l.prices.has_value());
  EXPECT_DOUBLE_EQ(l.prices->prompt_usd_per_million, 1.25);
  EXPECT_DOUBLE_EQ(l.prices->completion_usd_per_million, 10);
}

TEST(BrainConfig, LlmDefaultsWhenOnlyUrlAndModelAreGiven) {
  auto c = parse_ok("implementer: llm\nllm:\n  base_url: http://127.0.0.1:8080/v1\n"
                    "  model: qwen2.5-coder\n");
  ASSERT_TRUE(c.llm.has_value());
  llm_config defaults;
  EXPECT_EQ(c.llm->api_key_env, "");  // a local server: no key
  EXPECT_EQ(c.llm->max_tokens, defaults.max_tokens);
  EXPECT_EQ(c.llm->retries, defaults.retries);
  EXPECT_DOUBLE_EQ(c.llm->timeout_seconds, defaults.timeout_seconds);
  EXPECT_FALSE(c.llm->prices.has_value());
}

TEST(BrainConfig, AnUnusedLlmSectionIsAllowed) {
  auto c = parse_ok(full_llm);
  EXPECT_TRUE(c.llm.has_value());
  EXPECT_EQ(c.planner, std::vector<K>{K::expert});
}

TEST(BrainConfig, ErrorsPointAtTheOffendingLine) {
  auto e = parse_bad("planner: expert\n\nimplementer: [expert, llm]\n");
  EXPECT_EQ(e.field, "implementer[1]");
  EXPECT_EQ(e.line, 3);
  EXPECT_EQ(e.column, 23);
  EXPECT_EQ(e.what().rfind("brains.yaml:3:23: implementer[1]: ", 0), 0u) << e.what();
}

TEST(BrainConfig, FailureLeavesTheOutputUntouched) {
  brain_config c;
  c.planner = {K::llm};
  spec_error e;
  ASSERT_FALSE(parse_brain_config("planner: nope\n", "x.yaml", c, e));
  EXPECT_EQ(c.planner, std::vector<K>{K::llm});
}

TEST(BrainConfig, MissingFileIsAnErrorNamingIt) {
  brain_config c;
  spec_error e;
  ASSERT_FALSE(load_brain_config("/nonexistent/brains.yaml", c, e));
  EXPECT_EQ(e.file, "/nonexistent/brains.yaml");
  EXPECT_FALSE(e.message.empty());
}

// The YAML examples of docs/brains.md parse (they are what users copy).
TEST(BrainConfig, DocumentedExamplesParse) {
  std::ifstream in(MAXKERNEL_SOURCE_DIR "/docs/brains.md");
  ASSERT_TRUE(in) << "docs/brains.md";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  int examples = 0;
  for (size_t pos = 0; (pos = doc.find("```yaml\n", pos)) != std::string::npos;) {
    size_t start = pos + 8;
    size_t end = doc.find("```", start);
    ASSERT_NE(end, std::string::npos);
    std::string text = doc.substr(start, end - start);
    brain_config c;
    spec_error e;
    EXPECT_TRUE(parse_brain_config(text, "docs/brains.md example", c, e))
        << e.what() << "\n" << text;
    ++examples;
    pos = end + 3;
  }
  EXPECT_GE(examples, 2);
}

// ---- The bad_brains corpus ----------------------------------------------------------------

std::vector<std::string> bad_brain_files() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(MAXKERNEL_BAD_BRAINS_DIR))
    if (entry.path().extension() == ".yaml")
      files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  return files;
}

// The first line reads `# expect: FIELD`; an optional second `# message: TEXT` is a part of
// the message.
std::pair<std::string, std::string> expectation(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  auto after = [](const std::string& line, const std::string& prefix) {
    return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : std::string{};
  };
  return {after(first, "# expect: "), after(second, "# message: ")};
}

class BadBrains : public ::testing::TestWithParam<std::string> {};

TEST_P(BadBrains, FailsNamingTheFieldAndLine) {
  fs::path file = fs::path(MAXKERNEL_BAD_BRAINS_DIR) / GetParam();
  auto [field, message] = expectation(file);
  ASSERT_FALSE(field.empty()) << file << " lacks its `# expect: FIELD` first line";
  brain_config c;
  c.planner = {K::llm, K::expert};
  spec_error error;
  ASSERT_FALSE(load_brain_config(file.string(), c, error)) << file << " loaded";
  EXPECT_EQ(c.planner, (std::vector<K>{K::llm, K::expert}));
  EXPECT_EQ(error.field, field) << error.what();
  EXPECT_EQ(error.file, file.string());
  EXPECT_GT(error.line, 0) << error.what();
  EXPECT_GT(error.column, 0) << error.what();
  EXPECT_NE(error.what().find(":" + std::to_string(error.line) + ":"), std::string::npos);
  if (!message.empty()) {
    EXPECT_NE(error.message.find(message), std::string::npos)
        << "wanted '" << message << "' in: " << error.what();
  }
}

TEST(BadBrainsCorpus, CoversTheRequiredCases) {
  auto files = bad_brain_files();
  for (const char* required :
       {"unknown_role.yaml", "unknown_brain.yaml", "llm_without_section.yaml",
        "api_key_in_file.yaml", "api_key_env_is_key.yaml", "llm_missing_base_url.yaml",
        "temperature_too_high.yaml", "prices_missing_completion.yaml", "stray_comma.yaml",
        "non_utf8.yaml"})
    EXPECT_NE(std::find(files.begin(), files.end(), required), files.end()) << required;
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadBrains, ::testing::ValuesIn(bad_brain_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = fs::path(info.param).stem().string();
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c)))
                               c = '_';
                           return name;
                         });

}  // namespace
}  // namespace maxkernel::config::test
