// The LLM brain: planner, implementer and debugger over an OpenAI-compatible chat endpoint
// (config: the `llm:` section of the brain config, docs/brains.md). Each call renders its
// prompt from agents/llm/prompts/ with the request's data, sends it, and parses the reply
// (a JSON plan or a ```python module), sending unusable replies back with the reason. Token
// usage (and cost, when prices are configured) is written into the reply's Usage, on
// failure too. Candidates: origin "llm:<model>", template "", id the sha256 of the source.
#pragma once

#include "agents/brain.hpp"
#include "config/brain_config.hpp"

namespace maxkernel::agents::llm {

planner_brain_ptr make_llm_planner(const config::llm_config& config);
implementer_brain_ptr make_llm_implementer(const config::llm_config& config);
debugger_brain_ptr make_llm_debugger(const config::llm_config& config);

}  // namespace maxkernel::agents::llm
