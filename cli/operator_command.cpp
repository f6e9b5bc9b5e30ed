#include "cli/operator_command.hpp"

#include "maxkernel/schema/common.capnp.h"
#include "messages/capnp_io.hpp"

#include <capnp/message.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

namespace maxkernel::cli {

namespace {

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos)
    return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Words as a POSIX shell splits them: blanks separate, '...' is literal, "..." keeps blanks
// and takes \" and \\, a backslash outside quotes escapes the next character. So JSON
// strings can be written `order='"kn"'` or `order="\"kn\""`.
std::optional<std::vector<std::string>> split_words(const std::string& s, std::string& error) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      if (in_word)
        words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      auto end = s.find('\'', i + 1);
      if (end == std::string::npos) {
        error = "unterminated ' quote";
        return std::nullopt;
      }
      word += s.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < s.size() && s[j] != '"'; ++j) {
        if (s[j] == '\\' && j + 1 < s.size() && (s[j + 1] == '"' || s[j + 1] == '\\'))
          ++j;
        word += s[j];
      }
      if (j >= s.size()) {
        error = "unterminated \" quote";
        return std::nullopt;
      }
      i = j;
    } else if (c == '\\' && i + 1 < s.size()) {
      word += s[++i];
    } else {
      word += c;
    }
  }
  if (in_word)
    words.push_back(std::move(word));
  return words;
}

parsed_operator_command fail(std::string error) {
  parsed_operator_command out;
  out.error = std::move(error);
  return out;
}

parsed_operator_command done(operator_command cmd) {
  parsed_operator_command out;
  out.ok = true;
  out.command = std::move(cmd);
  return out;
}

parsed_operator_command decision(schema::DecisionKind kind) {
  operator_command cmd;
  cmd.what = operator_command::action::decide;
  cmd.kind = kind;
  return done(std::move(cmd));
}

// A kernel module named on the line: its whole text, or why it cannot be used.
std::optional<std::string> read_module(const std::string& path, std::string& error) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    error = "cannot read " + path + ": it is a directory";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot read " + path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    error = "cannot read " + path;
    return std::nullopt;
  }
  auto source = text.str();
  if (trim(source).empty()) {
    error = path + " is empty";
    return std::nullopt;
  }
  return source;
}

parsed_operator_command from_file(schema::DecisionKind kind, const std::string& verb,
                                  const std::string& rest) {
  std::string error;
  auto words = split_words(rest, error);
  if (!words)
    return fail(verb + ": " + error);
  if (words->size() != 1)
    return fail(verb + " needs one FILE (a Python module defining workload): " + verb + " FILE");
  auto source = read_module(words->front(), error);
  if (!source)
    return fail(verb + ": " + error);
  auto out = decision(kind);
  out.command.source = std::move(*source);
  out.command.source_file = words->front();
  return out;
}

parsed_operator_command parse_edit(const std::string& rest) {
  std::string error;
  auto words = split_words(rest, error);
  if (!words)
    return fail("edit: " + error);
  if (words->empty())
    return fail("edit needs NAME=JSON changes, e.g. edit bm=256 order='\"kn\"'");
  auto out = decision(schema::DecisionKind::EDIT);
  std::set<std::string> seen;
  for (auto& w : *words) {
    auto eq = w.find('=');
    if (eq == std::string::npos || eq == 0)
      return fail("edit: '" + w + "' is not NAME=JSON");
    auto name = w.substr(0, eq);
    auto value = w.substr(eq + 1);
    if (!seen.insert(name).second)
      return fail("edit: " + name + " is given twice");
    if (!nlohmann::json::accept(value))
      return fail("edit: the value of " + name + " is not JSON: " + (value.empty() ? "(empty)" : value)
                  + " (a string needs quotes: " + name + "='\"text\"')");
    out.command.changes.emplace_back(name, value);
  }
  return out;
}

parsed_operator_command parse_handover(const std::string& rest) {
  auto n = trim(rest);
  bool digits = !n.empty() && n.size() <= 7
                && n.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoul(n) == 0)
    return fail("handover needs a number of steps >= 1, e.g. handover 3 (got '" + n + "')");
  auto out = decision(schema::DecisionKind::HAND_OVER);
  out.command.steps = static_cast<uint32_t>(std::stoul(n));
  return out;
}

}  // namespace

parsed_operator_command parse_operator_command(const std::string& line) {
  auto text = trim(line);
  if (text.empty() || text.front() == '#')
    return done({});
  auto space = text.find_first_of(" \t");
  auto verb = text.substr(0, space);
  auto rest = space == std::string::npos ? std::string{} : trim(text.substr(space));
  auto no_arguments = [&](parsed_operator_command out) {
    return rest.empty() ? out : fail(verb + " takes no arguments (got '" + rest + "')");
  };
  auto local = [](operator_command::action what) {
    operator_command cmd;
    cmd.what = what;
    return done(cmd);
  };
  if (verb == "approve")
    return no_arguments(decision(schema::DecisionKind::APPROVE));
  if (verb == "reject") {
    auto out = decision(schema::DecisionKind::REJECT);
    out.command.text = rest;  // feedback for the planner; may be empty
    return out;
  }
  if (verb == "hint") {
    if (rest.empty())
      return fail("hint needs a text, e.g. hint try a larger block along rows");
    auto out = decision(schema::DecisionKind::HINT);
    out.command.text = rest;
    return out;
  }
  if (verb == "edit")
    return parse_edit(rest);
  if (verb == "edit-source")
    return from_file(schema::DecisionKind::EDIT, verb, rest);
  if (verb == "takeover")
    return from_file(schema::DecisionKind::TAKE_OVER, verb, rest);
  if (verb == "handover")
    return parse_handover(rest);
  if (verb == "stop")
    return no_arguments(decision(schema::DecisionKind::STOP));
  if (verb == "show")
    return no_arguments(local(operator_command::action::show));
  if (verb == "help")
    return local(operator_command::action::help);
  if (verb == "release")
    return no_arguments(local(operator_command::action::release));
  if (verb == "quit" || verb == "detach")
    return no_arguments(local(operator_command::action::quit));
  return fail("unknown command '" + verb + "' (help lists the commands)");
}

std::string encode_decision(const operator_command& command, uint32_t seq) {
  capnp::MallocMessageBuilder msg;
  auto cmd = msg.initRoot<schema::OperatorCommand>();
  cmd.setSchemaVersion(schema::SCHEMA_VERSION);
  auto d = cmd.initDecision();
  d.setSchemaVersion(schema::SCHEMA_VERSION);
  d.setSeq(seq);
  d.setKind(command.kind);
  d.setText(command.text);
  if (!command.changes.empty()) {
    auto changes = d.initChanges(static_cast<unsigned>(command.changes.size()));
    for (unsigned i = 0; i < changes.size(); ++i) {
      changes[i].setName(command.changes[i].first);
      changes[i].setValue(command.changes[i].second);
    }
  }
  d.setSource(command.source);
  d.setSteps(command.steps);
  return messages::encode(msg);
}

const char* operator_command_help() {
  return "decisions on the waiting proposal:\n"
         "  approve                    accept it\n"
         "  reject [FEEDBACK...]       refuse it; the feedback goes to the planner\n"
         "  edit NAME=JSON...          evaluate it with these parameters (edit bm=256 order='\"kn\"')\n"
         "  edit-source FILE           evaluate this module instead of its source\n"
         "  hint TEXT                  accept it; the text steers the next plans\n"
         "  takeover FILE              evaluate your own kernel (a module defining workload)\n"
         "  handover N                 accept it and let auto decide the next N proposals\n"
         "  stop                       end the search now\n"
         "console:\n"
         "  show                       print the waiting proposal again\n"
         "  help                       this list\n"
         "  release                    give up the hitl floor (your first decision took it;\n"
         "                             one shell decides at a time)\n"
         "  quit | detach              leave (the search goes on)\n";
}

}  // namespace maxkernel::cli
