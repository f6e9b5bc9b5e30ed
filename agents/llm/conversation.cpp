#include "agents/llm/conversation.hpp"

#include "agents/llm/prompt_text.hpp"

#include <fmt/format.h>

#include <vector>

namespace maxkernel::agents::llm {

brain_status converse(const chat_client& client, const std::string& system,
                      const std::string& user, const reply_check& accept, usage_tally& tally) {
  std::vector<chat_message> messages{{"system", system}, {"user", user}};
  const uint32_t attempts = client.config().retries + 1;
  std::string last_error;
  for (uint32_t i = 0; i < attempts; ++i) {
    chat_completion reply;
    if (auto s = client.complete(messages, reply, tally); !s.ok())
      return s;
    std::string error;
    if (accept(reply, error))
      return {};
    last_error = error.empty() ? "the reply was refused" : error;
    std::string rejection, fill_error;
    if (!fill_prompt("reply_rejected.md", {{"error", last_error}}, rejection, fill_error))
      return brain_status::fail(messages::error_code::internal, fill_error);
    messages.push_back({"assistant", reply.content});
    messages.push_back({"user", std::move(rejection)});
  }
  return brain_status::fail(
      messages::error_code::service_unavailable,
      fmt::format("{} ({}): no usable reply in {} attempt{} (llm.retries: {}); last problem: {}",
                  client.endpoint(), client.config().model, attempts, attempts == 1 ? "" : "s",
                  client.config().retries, last_error));
}

}  // namespace maxkernel::agents::llm
