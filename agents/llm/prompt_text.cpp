#include "agents/llm/prompt_text.hpp"

#include <cctype>
#include <set>

namespace maxkernel::agents::llm {

namespace {

bool is_name(const std::string& key) {
  if (key.empty())
    return false;
  for (char c : key)
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
          c == '_'))
      return false;
  return true;
}

}  // namespace

bool fill_placeholders(const std::string& name, const std::string& text,
                       const std::map<std::string, std::string>& values, std::string& out,
                       std::string& error) {
  std::set<std::string> used;
  std::string filled;
  size_t pos = 0;
  while (true) {
    size_t open = text.find("{{", pos);
    if (open == std::string::npos) {
      filled.append(text, pos, std::string::npos);
      break;
    }
    size_t close = text.find("}}", open + 2);
    if (close == std::string::npos) {
      error = name + ": unterminated placeholder at offset " + std::to_string(open);
      return false;
    }
    std::string key = text.substr(open + 2, close - open - 2);
    if (!is_name(key)) {
      error = name + ": '{{" + key.substr(0, 40) + "}}' is not a placeholder name ([a-z0-9_])";
      return false;
    }
    auto v = values.find(key);
    if (v == values.end()) {
      error = name + ": no value for placeholder {{" + key + "}}";
      return false;
    }
    used.insert(key);
    filled.append(text, pos, open - pos);
    filled += v->second;
    pos = close + 2;
  }
  for (const auto& [key, _] : values)
    if (!used.count(key)) {
      error = name + ": value " + key + " has no placeholder";
      return false;
    }
  out = std::move(filled);
  return true;
}

bool fill_prompt(const std::string& file, const std::map<std::string, std::string>& values,
                 std::string& out, std::string& error) {
  auto it = embedded_prompts().find(file);
  if (it == embedded_prompts().end()) {
    error = "no prompt file " + file;
    return false;
  }
  return fill_placeholders(file, it->second, values, out, error);
}

}  // namespace maxkernel::agents::llm
