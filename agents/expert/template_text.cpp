#include "agents/expert/template_text.hpp"

#include <set>

namespace maxkernel::agents::expert {

bool fill_template(const std::string& file, const std::map<std::string, std::string>& values,
                   std::string& out, std::string& error) {
  auto it = embedded_templates().find(file);
  if (it == embedded_templates().end()) {
    error = "no template file " + file;
    return false;
  }
  const std::string& text = it->second;
  std::set<std::string> used;
  out.clear();
  size_t pos = 0;
  while (true) {
    size_t open = text.find("{{", pos);
    if (open == std::string::npos) {
      out.append(text, pos, std::string::npos);
      break;
    }
    size_t close = text.find("}}", open + 2);
    if (close == std::string::npos) {
      error = file + ": unterminated placeholder at offset " + std::to_string(open);
      return false;
    }
    std::string key = text.substr(open + 2, close - open - 2);
    auto v = values.find(key);
    if (v == values.end()) {
      error = file + ": no value for placeholder {{" + key + "}}";
      return false;
    }
    used.insert(key);
    out.append(text, pos, open - pos);
    out += v->second;
    pos = close + 2;
  }
  for (const auto& [key, _] : values)
    if (!used.count(key)) {
      error = file + ": value " + key + " has no placeholder";
      return false;
    }
  return true;
}

std::string indent(const std::string& code, int spaces) {
  std::string pad(static_cast<size_t>(spaces), ' ');
  std::string out;
  for (size_t i = 0; i < code.size(); ++i) {
    out += code[i];
    if (code[i] == '\n' && i + 1 < code.size() && code[i + 1] != '\n')
      out += pad;
  }
  return out;
}

}  // namespace maxkernel::agents::expert
