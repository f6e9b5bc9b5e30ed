// One exchange with the model that must end in a usable reply: the system and user prompts
// are sent; a reply that `accept` refuses is sent back with the reason (prompts/
// reply_rejected.md) and the model answers again, up to llm.retries times. Then the brain
// gives up with service_unavailable naming the last reason.
#pragma once

#include "agents/brain.hpp"
#include "agents/llm/chat_client.hpp"
#include "agents/llm/usage_tally.hpp"

#include <functional>
#include <string>

namespace maxkernel::agents::llm {

// true when the completion is usable; otherwise false with `error` saying what is wrong and
// what is expected (it goes back to the model verbatim).
using reply_check = std::function<bool(const chat_completion& reply, std::string& error)>;

brain_status converse(const chat_client& client, const std::string& system,
                      const std::string& user, const reply_check& accept, usage_tally& tally);

}  // namespace maxkernel::agents::llm
