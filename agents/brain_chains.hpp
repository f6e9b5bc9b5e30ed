// The brain chain of each role, built from the brain config (config/brain_config.hpp): the
// expert brain over every template family, the LLM brain over the configured endpoint.
#pragma once

#include "agents/brain.hpp"
#include "config/brain_config.hpp"

#include <vector>

namespace maxkernel::agents {

struct brain_chains {
  std::vector<planner_brain_ptr> planner;
  std::vector<implementer_brain_ptr> implementer;
  std::vector<debugger_brain_ptr> debugger;
  bool uses_llm = false;
};

brain_chains make_brain_chains(const config::brain_config& config);

}  // namespace maxkernel::agents
