// The planner's reply: a JSON list of steps (or {"steps": [...]}), bare or inside a ```json
// fence, possibly after the model's thinking. Errors say exactly what is wrong and what is
// expected, because they are sent back to the model for another try.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace maxkernel::agents::llm {

struct planned_step {
  std::string move;             // snake_case name of the strategy
  std::string parent_id;        // a history candidate's full id; "" for a kernel from scratch
  std::string rationale;
  std::string expected_effect;
  std::string instructions;     // for the implementer
  double score = 0;
  std::vector<std::pair<std::string, std::string>> changes;  // name -> JSON literal
};

// `known_ids`: the ids of the candidates in the history; a step's `parent` must be one of them
// or a unique prefix of at least 8 characters (it is expanded). false with `error`.
bool parse_plan_reply(const std::string& reply, const std::vector<std::string>& known_ids,
                      std::vector<planned_step>& steps, std::string& error);

// The reply without a leading <think>...</think> block (reasoning models inline it).
std::string strip_thinking(const std::string& reply);

}  // namespace maxkernel::agents::llm
