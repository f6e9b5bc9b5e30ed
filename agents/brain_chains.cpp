#include "agents/brain_chains.hpp"

#include "agents/expert/expert_brains.hpp"
#include "agents/llm/llm_brains.hpp"

namespace maxkernel::agents {

brain_chains make_brain_chains(const config::brain_config& config) {
  brain_chains out;
  // brain_config guarantees an llm section whenever a chain names llm.
  auto llm = config.llm.value_or(config::llm_config{});
  for (auto kind : config.planner)
    out.planner.push_back(kind == config::brain_kind::llm ? llm::make_llm_planner(llm)
                                                          : expert::make_expert_planner());
  for (auto kind : config.implementer)
    out.implementer.push_back(kind == config::brain_kind::llm ? llm::make_llm_implementer(llm)
                                                              : expert::make_expert_implementer());
  for (auto kind : config.debugger)
    out.debugger.push_back(kind == config::brain_kind::llm ? llm::make_llm_debugger(llm)
                                                           : expert::make_expert_debugger());
  out.uses_llm = config.llm.has_value();
  return out;
}

}  // namespace maxkernel::agents
