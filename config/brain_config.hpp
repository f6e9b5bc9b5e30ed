// The brain config (docs/brains.md): which brain serves each role of the sub-agent pool, and
// the LLM endpoint when one is used. A role's chain is tried in order: [expert, llm] asks the
// expert brain first and the LLM when the expert has no template or gives up.
#pragma once

#include "config/spec_error.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace maxkernel::config {

enum class brain_kind { expert, llm };

const char* to_string(brain_kind kind);

// USD per million tokens, as providers publish them.
struct llm_prices {
  double prompt_usd_per_million = 0;
  double completion_usd_per_million = 0;
};

// An OpenAI-compatible chat-completions endpoint.
struct llm_config {
  std::string base_url;          // without a trailing '/'; {base_url}/chat/completions is POSTed
  std::string model;
  std::string api_key_env;       // NAME of the environment variable holding the key; "" sends
                                 // no Authorization header (a local server)
  double temperature = 0.2;
  uint32_t max_tokens = 8192;
  double timeout_seconds = 300;  // per HTTP request
  uint32_t retries = 3;          // further attempts after the first (transport and parse)
  double backoff_seconds = 2;    // first wait; doubles per retry (Retry-After wins)
  std::optional<llm_prices> prices;  // cost is reported only when set
};

struct brain_config {
  std::vector<brain_kind> planner{brain_kind::expert};
  std::vector<brain_kind> implementer{brain_kind::expert};
  std::vector<brain_kind> debugger{brain_kind::expert};
  std::optional<llm_config> llm;  // present whenever a chain names llm
  std::string source_path;        // the file read; "" for the defaults
};

// The configuration without a file: every role expert, no LLM.
brain_config default_brain_config();

// Reads and validates a brain config file. On failure returns false with `error` naming the
// file, line, column and field; `out` is then left untouched. Never throws.
bool load_brain_config(const std::string& path, brain_config& out, spec_error& error);

// The same on text already read; `file` only labels errors.
bool parse_brain_config(const std::string& text, const std::string& file, brain_config& out,
                        spec_error& error);

}  // namespace maxkernel::config
