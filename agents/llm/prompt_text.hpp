// The prompts of agents/llm/prompts/*.md, embedded at build time, and the one placeholder
// syntax they use: {{name}} is replaced by a value. As for the expert's templates, every
// placeholder must get a value and every value must be used, so a renamed placeholder fails
// loudly instead of sending a prompt with a hole in it.
#pragma once

#include <map>
#include <string>

namespace maxkernel::agents::llm {

// file name ("planner.md") -> contents.
const std::map<std::string, std::string>& embedded_prompts();

// Fills the placeholders of `text` (named `name` in errors). Values are inserted verbatim and
// never scanned for placeholders themselves. false with `error` naming the placeholder.
bool fill_placeholders(const std::string& name, const std::string& text,
                       const std::map<std::string, std::string>& values, std::string& out,
                       std::string& error);

// fill_placeholders on the embedded prompt `file`.
bool fill_prompt(const std::string& file, const std::map<std::string, std::string>& values,
                 std::string& out, std::string& error);

}  // namespace maxkernel::agents::llm
