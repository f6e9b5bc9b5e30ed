// The chat-completions client against a local replay server (tests/support/replay_server.py):
// what it sends (path, model, messages, Bearer key from the named variable), how it retries
// (timeouts, dropped connections, 429 with Retry-After, 5xx, malformed bodies) and what it
// refuses at once (401, a missing key variable, a wait longer than it will honour).
#include "agents/llm/chat_client.hpp"
#include "tests/agents/llm/llm_requests.hpp"
#include "tests/agents/llm/replay_process.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

namespace maxkernel::tests {
namespace {

using agents::llm::chat_client;
using agents::llm::chat_completion;
using agents::llm::chat_message;
using agents::llm::usage_tally;
using messages::error_code;

class ChatClient : public ::testing::Test {
protected:
  void SetUp() override { setenv(key_env, key_value, 1); }
  void TearDown() override { unsetenv(key_env); }

  static std::vector<chat_message> prompt() {
    return {{"system", "You write Pallas TPU kernels."}, {"user", "Write a matmul kernel."}};
  }
};

#define START(server, file)      \
  replay_process server(file);   \
  ASSERT_TRUE(server.started()) << server.error()

TEST_F(ChatClient, SendsTheStandardRequestWithTheBearerKey) {
  START(server, "plain_reply.json");
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  ASSERT_TRUE(s.ok()) << s.message;  // the server answers 400 when its checks fail
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0]["mismatch"], nullptr);
  EXPECT_EQ(requests[0]["path"], "/v1/chat/completions");
  EXPECT_EQ(requests[0]["method"], "POST");
  EXPECT_EQ(requests[0]["headers"]["Authorization"], std::string("Bearer ") + key_value);
  EXPECT_EQ(requests[0]["headers"]["Content-Type"], "application/json");
  auto body = nlohmann::json::parse(requests[0]["body"].get<std::string>());
  EXPECT_EQ(body["model"], "replay-model");
  EXPECT_DOUBLE_EQ(body["temperature"].get<double>(), 0.2);
  EXPECT_EQ(body["max_tokens"], 2048);
  ASSERT_EQ(body["messages"].size(), 2u);
  EXPECT_EQ(body["messages"][0]["role"], "system");
  EXPECT_EQ(body["messages"][1]["role"], "user");
  EXPECT_EQ(body["messages"][1]["content"], "Write a matmul kernel.");
  // Only the standard fields: any OpenAI-compatible server accepts them.
  for (const auto& [k, v] : body.items())
    EXPECT_TRUE(k == "model" || k == "messages" || k == "temperature" || k == "max_tokens") << k;
  EXPECT_EQ(tally.prompt_tokens, 1200u);
  EXPECT_EQ(tally.completion_tokens, 800u);
}

TEST_F(ChatClient, RequestTheServerRefusesIsNotRetried) {
  START(server, "plain_reply.json");
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto s = client.complete({{"user", "something else"}}, out, tally);
  EXPECT_EQ(s.code, error_code::service_unavailable);
  EXPECT_NE(s.message.find("HTTP 400"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("Write a matmul kernel."), std::string::npos) << s.message;
  EXPECT_EQ(tally.calls, 1u);
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST_F(ChatClient, ParsesContentFinishReasonAndUsage) {
  START(server, "no_key.json");
  auto config = replay_config(server);
  config.api_key_env = "";  // a local server: no Authorization header
  chat_client client(config);
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_NE(out.content.find("def workload(x, w):"), std::string::npos);
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_TRUE(out.has_usage);
  EXPECT_EQ(out.prompt_tokens, 1000u);
  EXPECT_EQ(out.completion_tokens, 500u);
  EXPECT_EQ(tally.prompt_tokens, 1000u);
  EXPECT_EQ(tally.completion_tokens, 500u);
  EXPECT_EQ(tally.calls, 1u);
  EXPECT_EQ(server.requests()[0]["headers"].count("Authorization"), 0u);
}

TEST_F(ChatClient, TimeoutThenSuccess) {
  START(server, "timeout_then_success.json");
  auto config = replay_config(server);
  config.timeout_seconds = 0.5;  // the first answer comes after 3 s
  chat_client client(config);
  chat_completion out;
  usage_tally tally;
  auto t0 = std::chrono::steady_clock::now();
  auto s = client.complete(prompt(), out, tally);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(tally.calls, 2u);
  EXPECT_EQ(server.requests().size(), 2u);
  EXPECT_EQ(tally.prompt_tokens, 2500u);  // only the answered request's tokens
  EXPECT_LT(seconds, 2.5) << "the client waited for the slow answer instead of timing out";
  EXPECT_NE(out.content.find("pallas_call"), std::string::npos);
}

TEST_F(ChatClient, RateLimitedHonoursRetryAfter) {
  START(server, "rate_limited_then_success.json");
  auto config = replay_config(server);  // backoff 0.01 s: the wait comes from Retry-After
  chat_client client(config);
  chat_completion out;
  usage_tally tally;
  auto t0 = std::chrono::steady_clock::now();
  auto s = client.complete(prompt(), out, tally);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(tally.calls, 2u);
  EXPECT_GE(seconds, 0.95) << "Retry-After: 1 was not honoured";
}

TEST_F(ChatClient, ServerErrorsAreRetried) {
  START(server, "server_error_then_success.json");  // 500, 503 (HTML body), then 200
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(tally.calls, 3u);
  EXPECT_EQ(server.requests().size(), 3u);
}

TEST_F(ChatClient, ServerErrorsExhaustTheRetries) {
  START(server, "server_errors_exhausted.json");
  chat_client client(replay_config(server));  // retries: 2 -> 3 attempts
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  EXPECT_EQ(s.code, error_code::service_unavailable);
  EXPECT_NE(s.message.find("3 attempts"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("HTTP 502"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("bad gateway"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find(server.base_url()), std::string::npos) << s.message;
  EXPECT_EQ(tally.calls, 3u);
}

TEST_F(ChatClient, UnauthorizedIsAClearErrorWithoutRetry) {
  START(server, "unauthorized.json");
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  EXPECT_EQ(s.code, error_code::service_unavailable);
  EXPECT_NE(s.message.find("HTTP 401"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("Incorrect API key provided"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find(key_env), std::string::npos) << s.message;
  EXPECT_EQ(s.message.find(key_value), std::string::npos) << "the key leaked into a message";
  EXPECT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(tally.calls, 1u);
}

TEST_F(ChatClient, MalformedJsonBodyIsRetried) {
  START(server, "malformed_body_then_success.json");
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(tally.calls, 2u);
  EXPECT_NE(out.content.find("def workload"), std::string::npos);
}

TEST_F(ChatClient, MalformedJsonBodyNamedWhenRetriesRunOut) {
  START(server, "malformed_body_then_success.json");
  auto config = replay_config(server);
  config.retries = 0;
  chat_client client(config);
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  EXPECT_EQ(s.code, error_code::service_unavailable);
  EXPECT_NE(s.message.find("malformed JSON"), std::string::npos) << s.message;
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST_F(ChatClient, DroppedConnectionIsRetried) {
  START(server, "connection_dropped_then_success.json");
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(tally.calls, 2u);
}

TEST_F(ChatClient, UnreachableEndpointFailsAfterRetries) {
  config::llm_config config;
  config.base_url = "http://127.0.0.1:" + std::to_string(closed_port()) + "/v1";
  config.model = "m";
  config.api_key_env = key_env;
  config.timeout_seconds = 2;
  config.retries = 2;
  config.backoff_seconds = 0.01;
  chat_client client(config);
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  EXPECT_EQ(s.code, error_code::service_unavailable);
  EXPECT_NE(s.message.find("connection failed"), std::string::npos) << s.message;
  EXPECT_EQ(tally.calls, 3u);
}

TEST_F(ChatClient, RetryAfterBeyondTheLimitGivesUp) {
  START(server, "retry_after_too_long.json");
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto t0 = std::chrono::steady_clock::now();
  auto s = client.complete(prompt(), out, tally);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code, error_code::service_unavailable);
  EXPECT_NE(s.message.find("7200"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("quota exhausted"), std::string::npos) << s.message;
  EXPECT_EQ(tally.calls, 1u);
  EXPECT_LT(seconds, 5);
}

TEST_F(ChatClient, MissingKeyVariableIsAClearErrorBeforeAnyRequest) {
  START(server, "no_key.json");
  unsetenv(key_env);
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  EXPECT_EQ(s.code, error_code::service_unavailable);
  EXPECT_NE(s.message.find(key_env), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("not set"), std::string::npos) << s.message;
  EXPECT_EQ(tally.calls, 0u);
  EXPECT_TRUE(server.requests().empty());
}

TEST_F(ChatClient, KeyWithANewlineIsRefused) {
  START(server, "no_key.json");
  setenv(key_env, "sk-abc\r\nX-Injected: 1", 1);
  chat_client client(replay_config(server));
  chat_completion out;
  usage_tally tally;
  auto s = client.complete(prompt(), out, tally);
  EXPECT_EQ(s.code, error_code::service_unavailable);
  EXPECT_NE(s.message.find("control character"), std::string::npos) << s.message;
  EXPECT_TRUE(server.requests().empty());
}

}  // namespace
}  // namespace maxkernel::tests
