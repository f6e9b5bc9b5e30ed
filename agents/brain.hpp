// The brains behind the roles. A role actor (planner, implementer, debugger) holds one
// brain chain from the config (config/brain_config.hpp) and calls it; the expert brain
// (agents/expert/) and the LLM brain (agents/llm/) implement the same interfaces, so one
// actor implementation per role serves every mode and every brain.
// Brains are plain C++, called from the role's actor; an LLM brain blocks on HTTP, so its
// actors run detached.
#pragma once

#include "maxkernel/schema/agent.capnp.h"
#include "messages/error.hpp"

#include <memory>
#include <string>

namespace maxkernel::agents {

// ok, or why a brain could not answer: bad_input (a request it cannot act on),
// service_unavailable (an endpoint down or replies that never parsed), internal.
struct brain_status {
  messages::error_code code = messages::error_code::none;
  std::string message;
  bool ok() const { return code == messages::error_code::none; }
  static brain_status fail(messages::error_code c, std::string m) { return {c, std::move(m)}; }
};

class planner_brain {
public:
  virtual ~planner_brain() = default;
  virtual std::string name() const = 0;  // expert | llm
  // Fills `out` (steps best first; noTemplate + message when it has nothing to offer).
  virtual brain_status plan(schema::PlannerRequest::Reader request, schema::Plan::Builder out) = 0;
};

class implementer_brain {
public:
  virtual ~implementer_brain() = default;
  virtual std::string name() const = 0;
  virtual brain_status implement(schema::ImplementRequest::Reader request,
                                 schema::ImplementReply::Builder out) = 0;
};

class debugger_brain {
public:
  virtual ~debugger_brain() = default;
  virtual std::string name() const = 0;
  // repaired=false with a reason when no fix applies (not an error).
  virtual brain_status debug(schema::DebugRequest::Reader request,
                             schema::DebugReply::Builder out) = 0;
};

using planner_brain_ptr = std::shared_ptr<planner_brain>;
using implementer_brain_ptr = std::shared_ptr<implementer_brain>;
using debugger_brain_ptr = std::shared_ptr<debugger_brain>;

}  // namespace maxkernel::agents
