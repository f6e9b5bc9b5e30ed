// An OpenAI-compatible chat-completions client (POST {base_url}/chat/completions) over
// libcurl with TLS verification. Sends only the fields every compatible server accepts
// (model, messages, temperature, max_tokens), so Gemini's OpenAI endpoint, vLLM, llama.cpp's
// server and OpenAI all work. Transport failures are retried with exponential backoff:
// timeouts, connection errors, HTTP 429 (honouring Retry-After), 5xx, and 2xx bodies that
// are not a usable completion; other 4xx fail at once with the server's message.
#pragma once

#include "agents/brain.hpp"
#include "agents/llm/usage_tally.hpp"
#include "config/brain_config.hpp"

#include <string>
#include <vector>

namespace maxkernel::agents::llm {

struct chat_message {
  std::string role;     // system | user | assistant
  std::string content;
};

struct chat_completion {
  std::string content;        // choices[0].message.content
  std::string finish_reason;  // "stop", "length", ... ("" when the server gives none)
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
  bool has_usage = false;     // the server reported usage
};

class chat_client {
public:
  explicit chat_client(config::llm_config config);

  // One completion. Every HTTP request sent (retries included) and the tokens of every
  // completion received are added to `tally`. Fails with service_unavailable naming the
  // endpoint and the last problem (a missing API key variable included). Thread-safe.
  brain_status complete(const std::vector<chat_message>& messages, chat_completion& out,
                        usage_tally& tally) const;

  const config::llm_config& config() const { return config_; }
  std::string endpoint() const;  // {base_url}/chat/completions

private:
  config::llm_config config_;
};

}  // namespace maxkernel::agents::llm
