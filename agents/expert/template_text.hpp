// The Python files of agents/expert/templates/, embedded at build time, and the one
// placeholder syntax they use: {{name}} is replaced by a value; every placeholder must get
// one and every value must be used, so a renamed placeholder fails loudly, not silently.
#pragma once

#include <map>
#include <string>

namespace maxkernel::agents::expert {

// file name ("matmul.py") -> contents.
const std::map<std::string, std::string>& embedded_templates();

// Fills `file`'s placeholders. false with `error` naming the file and the placeholder.
bool fill_template(const std::string& file, const std::map<std::string, std::string>& values,
                   std::string& out, std::string& error);

// Indents every line but the first of `code` by `spaces` (code generated into a block).
std::string indent(const std::string& code, int spaces);

}  // namespace maxkernel::agents::expert
