#include "agents/llm/plan_reply.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <optional>

namespace maxkernel::agents::llm {
namespace {

using json = nlohmann::json;

constexpr size_t max_move_length = 80;

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return s.substr(b, e - b);
}

// The contents of the first fenced block tagged json, else of the first fenced block that
// starts like JSON; nullopt without one.
std::optional<std::string> fenced_json(const std::string& text) {
  std::optional<std::string> untagged;
  size_t pos = 0;
  while ((pos = text.find("```", pos)) != std::string::npos) {
    size_t tag_end = text.find('\n', pos);
    if (tag_end == std::string::npos)
      break;
    std::string tag = trim(text.substr(pos + 3, tag_end - pos - 3));
    size_t close = text.find("```", tag_end + 1);
    if (close == std::string::npos)
      break;
    std::string body = text.substr(tag_end + 1, close - tag_end - 1);
    std::string t = trim(body);
    for (auto& c : tag)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (tag == "json")
      return body;
    if (!untagged && tag.empty() && !t.empty() && (t[0] == '[' || t[0] == '{'))
      untagged = body;
    pos = close + 3;
  }
  return untagged;
}

// From the first '[' or '{' to the last ']' or '}': JSON with prose around it.
std::optional<std::string> embedded_json(const std::string& text) {
  size_t b = text.find_first_of("[{");
  size_t e = text.find_last_of("]}");
  if (b == std::string::npos || e == std::string::npos || e < b)
    return std::nullopt;
  return text.substr(b, e - b + 1);
}

const char* expected_format =
    "Expected a JSON list of steps, each an object with \"move\" (snake_case name), "
    "\"parent\" (a candidate id from the history, or null for a kernel from scratch), "
    "\"rationale\", \"expected_effect\", \"instructions\" (strings) and \"score\" (a number, "
    "higher first); optionally \"changes\" (an object of parameter names to values).";

std::string required_text(const json& step, const char* key, const std::string& where,
                          std::string& error) {
  if (!step.contains(key)) {
    error = fmt::format("{}: the field \"{}\" is missing", where, key);
    return {};
  }
  const json& v = step[key];
  if (!v.is_string()) {
    error = fmt::format("{}.{}: expected a string, got {}", where, key, v.type_name());
    return {};
  }
  std::string s = trim(v.get<std::string>());
  if (s.empty())
    error = fmt::format("{}.{}: the string is empty", where, key);
  return s;
}

// The full id a parent reference names; "" with `error` when none or several do.
std::string resolve_parent(const std::string& ref, const std::vector<std::string>& ids,
                           const std::string& where, std::string& error) {
  std::string found;
  int matches = 0;
  for (const auto& id : ids) {
    if (id == ref)
      return id;
    if (ref.size() >= 8 && id.rfind(ref, 0) == 0) {
      found = id;
      ++matches;
    }
  }
  if (matches == 1)
    return found;
  if (ids.empty())
    error = fmt::format("{}.parent: \"{}\" is not a candidate: the history is empty, so every "
                        "step writes a kernel from scratch (parent null)",
                        where, ref);
  else if (matches > 1)
    error = fmt::format("{}.parent: \"{}\" matches several candidates; give the full id", where,
                        ref);
  else
    error = fmt::format("{}.parent: \"{}\" is not the id of a candidate in the history", where,
                        ref);
  return {};
}

bool read_step(const json& step, size_t index, const std::vector<std::string>& ids,
               planned_step& out, std::string& error) {
  std::string where = fmt::format("steps[{}]", index);
  if (!step.is_object()) {
    error = fmt::format("{}: expected an object, got {}", where, step.type_name());
    return false;
  }
  out.move = required_text(step, "move", where, error);
  if (!error.empty())
    return false;
  if (out.move.size() > max_move_length) {
    error = fmt::format("{}.move: a short snake_case name, not {} characters", where,
                        out.move.size());
    return false;
  }
  for (auto [key, field] : {std::pair{"rationale", &planned_step::rationale},
                            std::pair{"expected_effect", &planned_step::expected_effect},
                            std::pair{"instructions", &planned_step::instructions}}) {
    out.*field = required_text(step, key, where, error);
    if (!error.empty())
      return false;
  }
  if (!step.contains("score") || !step["score"].is_number() ||
      !std::isfinite(step["score"].get<double>())) {
    error = fmt::format("{}.score: expected a number", where);
    return false;
  }
  out.score = step["score"].get<double>();
  if (step.contains("parent") && !step["parent"].is_null()) {
    if (!step["parent"].is_string()) {
      error = fmt::format("{}.parent: expected a candidate id (a string) or null", where);
      return false;
    }
    std::string ref = trim(step["parent"].get<std::string>());
    if (!ref.empty()) {
      out.parent_id = resolve_parent(ref, ids, where, error);
      if (!error.empty())
        return false;
    }
  }
  if (step.contains("changes") && !step["changes"].is_null()) {
    if (!step["changes"].is_object()) {
      error = fmt::format("{}.changes: expected an object of parameter names to values", where);
      return false;
    }
    for (const auto& [k, v] : step["changes"].items())
      out.changes.emplace_back(k, v.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  return true;
}

}  // namespace

std::string strip_thinking(const std::string& reply) {
  std::string t = trim(reply);
  if (t.rfind("<think>", 0) == 0) {
    size_t end = t.find("</think>");
    if (end != std::string::npos)
      return t.substr(end + 8);
  }
  return reply;
}

bool parse_plan_reply(const std::string& reply, const std::vector<std::string>& known_ids,
                      std::vector<planned_step>& steps, std::string& error) {
  error.clear();
  std::string text = strip_thinking(reply);
  std::string candidate = trim(fenced_json(text).value_or(text));
  json j = json::parse(candidate, nullptr, false);
  if (j.is_discarded()) {
    // Prose around a bare JSON value.
    if (auto inner = embedded_json(candidate))
      j = json::parse(*inner, nullptr, false);
  }
  if (j.is_discarded()) {
    std::string detail;
    try {
      json probe = json::parse(candidate);
      detail = probe.type_name();  // not reached: the text does not parse
    } catch (const json::parse_error& e) {
      detail = e.what();
    }
    error = fmt::format("the reply is not valid JSON ({}). {}",
                        detail.empty() ? "no JSON found" : detail, expected_format);
    return false;
  }
  if (j.is_object() && j.contains("steps"))
    j = j["steps"];
  else if (j.is_object())
    j = json::array({j});  // a single step
  if (!j.is_array()) {
    error = fmt::format("the JSON is {}, not a list of steps. {}", j.type_name(),
                        expected_format);
    return false;
  }
  if (j.empty()) {
    error = fmt::format("the list of steps is empty. {}", expected_format);
    return false;
  }
  std::vector<planned_step> parsed;
  for (size_t i = 0; i < j.size(); ++i) {
    planned_step s;
    if (!read_step(j[i], i, known_ids, s, error)) {
      error += ". ";
      error += expected_format;
      return false;
    }
    parsed.push_back(std::move(s));
  }
  steps = std::move(parsed);
  return true;
}

}  // namespace maxkernel::agents::llm
