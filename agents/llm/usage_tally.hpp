// Tokens and requests an LLM brain spent on one role call, and their cost when the config
// gives prices; written into the reply's Usage.
#pragma once

#include "config/brain_config.hpp"
#include "maxkernel/schema/agent.capnp.h"

#include <cstdint>
#include <optional>

namespace maxkernel::agents::llm {

struct usage_tally {
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
  uint32_t calls = 0;  // HTTP requests sent, retries included

  // USD at the given prices (per million tokens).
  double cost_usd(const config::llm_prices& prices) const {
    return (static_cast<double>(prompt_tokens) * prices.prompt_usd_per_million +
            static_cast<double>(completion_tokens) * prices.completion_usd_per_million) /
           1e6;
  }

  void write(schema::Usage::Builder out, const std::optional<config::llm_prices>& prices) const {
    out.setPromptTokens(prompt_tokens);
    out.setCompletionTokens(completion_tokens);
    out.setCalls(calls);
    out.setHasCost(prices.has_value());
    out.setCostUsd(prices ? cost_usd(*prices) : 0.0);
  }
};

}  // namespace maxkernel::agents::llm
