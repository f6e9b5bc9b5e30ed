// The implementer's and debugger's replies: a ```python code block holding the whole kernel
// module (it defines `workload` at the top level and uses Pallas), plus for the debugger a
// `Cause:` and a `Fix:` line, or `GIVE UP: reason`. The checks catch what makes a reply
// unusable before the worker sees it (no block, a block cut off at max_tokens, unbalanced
// brackets, interpret mode switched on inside the kernel); Python's own checks stay with the
// worker's load phase, whose errors go to the debugger.
#pragma once

#include <optional>
#include <string>

namespace maxkernel::agents::llm {

struct code_reply {
  std::string source;  // the module, ending in a newline
  std::string prose;   // the reply's text outside the code blocks
};

// `finish_reason` of the completion ("length" explains a cut-off block). false with `error`.
bool parse_code_reply(const std::string& reply, const std::string& finish_reason,
                      code_reply& out, std::string& error);

struct repair_reply {
  bool gave_up = false;
  std::string cause;   // what was wrong ("" when not said)
  std::string fix;     // what was changed ("" when not said)
  std::string reason;  // why it gives up
  std::string source;  // the repaired module
};

bool parse_repair_reply(const std::string& reply, const std::string& finish_reason,
                        repair_reply& out, std::string& error);

// Where Python's brackets or a triple-quoted string do not close: "line 12: '(' is never
// closed". nullopt when they balance. Not a parser: strings and comments are skipped.
std::optional<std::string> unbalanced_python(const std::string& source);

}  // namespace maxkernel::agents::llm
