// The sub-agent pool as its users hold it: one handle per role. Every mode's supervisor gets
// the same pool (one implementation per role serves all three modes).
#pragma once

#include "messages/debugger_actor.hpp"
#include "messages/implementer_actor.hpp"
#include "messages/planner_actor.hpp"
#include "messages/profiler_actor.hpp"
#include "messages/tester_actor.hpp"

namespace maxkernel::messages {

struct agent_pool {
  planner_actor planner;
  implementer_actor implementer;
  debugger_actor debugger;
  tester_actor tester;
  profiler_actor profiler;
};

}  // namespace maxkernel::messages
