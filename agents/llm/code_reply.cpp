#include "agents/llm/code_reply.hpp"

#include "agents/llm/plan_reply.hpp"

#include <fmt/format.h>

#include <cctype>
#include <regex>
#include <vector>

namespace maxkernel::agents::llm {
namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct fenced_block {
  std::string tag;
  std::string body;
  int line = 0;  // of the opening fence, 1-based
};

struct split_reply {
  std::vector<fenced_block> blocks;
  std::string prose;
  bool unclosed = false;  // the last fence never closes
};

// Fences are lines starting (after indentation) with ```; the tag follows the backticks.
split_reply split_fences(const std::string& text) {
  split_reply out;
  bool inside = false;
  fenced_block current;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos)
      end = text.size();
    std::string line = text.substr(pos, end - pos);
    ++line_no;
    std::string t = trim(line);
    if (t.rfind("```", 0) == 0) {
      if (!inside) {
        inside = true;
        current = fenced_block{};
        current.tag = lower(trim(t.substr(3)));
        current.line = line_no;
      } else if (t.find_first_not_of('`') == std::string::npos) {
        inside = false;
        out.blocks.push_back(std::move(current));
      } else {
        current.body += line + "\n";  // ``` inside code (a docstring): keep it
      }
    } else if (inside) {
      current.body += line + "\n";
    } else {
      out.prose += line + "\n";
    }
    pos = end + 1;
  }
  if (inside) {
    out.unclosed = true;
    out.blocks.push_back(std::move(current));
  }
  return out;
}

bool python_tag(const std::string& tag) {
  return tag.empty() || tag == "python" || tag == "py" || tag == "python3";
}

bool defines_workload(const std::string& source) {
  static const std::regex def(R"((^|\n)(async\s+)?def\s+workload\s*\()");
  static const std::regex assign(R"((^|\n)workload\s*=)");
  return std::regex_search(source, def) || std::regex_search(source, assign);
}

// Interpret mode is switched on from outside (ARCHITECTURE.md); a kernel that sets it would
// be timed and lowered as something it is not on a TPU.
std::optional<std::string> sets_interpret_mode(const std::string& source) {
  static const std::regex interpret(R"(\binterpret\s*=\s*(True|1|pltpu\.InterpretParams))");
  static const std::regex force(R"(\b(force_tpu_interpret_mode|set_tpu_interpret_mode)\b)");
  std::smatch m;
  if (std::regex_search(source, m, interpret))
    return fmt::format("the kernel sets `{}`; interpret mode is switched on by the harness, "
                       "never in the kernel: remove it",
                       m.str(0));
  if (std::regex_search(source, m, force))
    return fmt::format("the kernel calls `{}`; interpret mode is switched on by the harness, "
                       "never in the kernel: remove it",
                       m.str(0));
  return std::nullopt;
}

const char* code_format =
    "Reply with the complete kernel module in one ```python code block that defines "
    "`def workload(...)` at the top level and uses jax.experimental.pallas.";

std::string cut_off_note(const std::string& finish_reason) {
  return finish_reason == "length"
             ? " The reply was cut off at the token limit (finish_reason: length): write a "
               "shorter module, without commentary."
             : "";
}

}  // namespace

std::optional<std::string> unbalanced_python(const std::string& s) {
  struct open_bracket {
    char c;
    int line;
  };
  std::vector<open_bracket> stack;
  int line = 1;
  size_t i = 0;
  const size_t n = s.size();
  auto closing = [](char c) { return c == '(' ? ')' : c == '[' ? ']' : '}'; };
  while (i < n) {
    char c = s[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (c == '#') {
      while (i < n && s[i] != '\n')
        ++i;
    } else if (c == '\'' || c == '"') {
      int start_line = line;
      if (i + 2 < n && s[i + 1] == c && s[i + 2] == c) {  // triple-quoted, may span lines
        i += 3;
        bool closed = false;
        while (i < n) {
          if (s[i] == '\\') {
            if (i + 1 < n && s[i + 1] == '\n')
              ++line;
            i += 2;
            continue;
          }
          if (s[i] == '\n')
            ++line;
          if (s[i] == c && i + 2 < n && s[i + 1] == c && s[i + 2] == c) {
            i += 3;
            closed = true;
            break;
          }
          ++i;
        }
        if (!closed)
          return fmt::format("line {}: a triple-quoted string ({}{}{}) is never closed",
                             start_line, c, c, c);
      } else {  // one line; a lone quote ends at the line's end (lenient)
        ++i;
        while (i < n && s[i] != c && s[i] != '\n') {
          if (s[i] == '\\' && i + 1 < n) {
            if (s[i + 1] == '\n')
              ++line;
            ++i;
          }
          ++i;
        }
        if (i < n && s[i] == c)
          ++i;
      }
    } else if (c == '(' || c == '[' || c == '{') {
      stack.push_back({c, line});
      ++i;
    } else if (c == ')' || c == ']' || c == '}') {
      if (stack.empty())
        return fmt::format("line {}: '{}' closes nothing", line, c);
      if (closing(stack.back().c) != c)
        return fmt::format("line {}: '{}' does not match the '{}' opened at line {}", line, c,
                           stack.back().c, stack.back().line);
      stack.pop_back();
      ++i;
    } else {
      ++i;
    }
  }
  if (!stack.empty())
    return fmt::format("line {}: '{}' is never closed (the code ends at line {})",
                       stack.back().line, stack.back().c, line);
  return std::nullopt;
}

bool parse_code_reply(const std::string& reply, const std::string& finish_reason,
                      code_reply& out, std::string& error) {
  error.clear();
  split_reply parts = split_fences(strip_thinking(reply));
  if (parts.blocks.empty()) {
    error = std::string("the reply has no ```python code block. ") + code_format +
            cut_off_note(finish_reason);
    return false;
  }
  // The last block that defines workload: models often show a fragment, then the module.
  const fenced_block* chosen = nullptr;
  for (const auto& b : parts.blocks)
    if (python_tag(b.tag) && defines_workload(b.body))
      chosen = &b;
  if (!chosen) {
    error = std::string("no ```python code block of the reply defines `workload` at the top "
                        "level (`def workload(*inputs):` taking the reference's inputs). ") +
            code_format + cut_off_note(finish_reason);
    return false;
  }
  if (parts.unclosed && chosen == &parts.blocks.back()) {
    error = fmt::format("the code block opened at line {} of the reply is never closed with "
                        "```.{} {}",
                        chosen->line, cut_off_note(finish_reason), code_format);
    return false;
  }
  std::string source = chosen->body;
  if (auto problem = unbalanced_python(source)) {
    error = fmt::format("the code does not parse: {}.{} {}", *problem,
                        cut_off_note(finish_reason), code_format);
    return false;
  }
  if (auto problem = sets_interpret_mode(source)) {
    error = *problem;
    return false;
  }
  if (source.find("pallas") == std::string::npos) {
    error = "the module does not use Pallas: import jax.experimental.pallas (as pl) and "
            "jax.experimental.pallas.tpu (as pltpu) and compute the outputs in pallas_call "
            "kernels.";
    return false;
  }
  if (source.empty() || source.back() != '\n')
    source += '\n';
  out.source = std::move(source);
  out.prose = trim(parts.prose);
  return true;
}

bool parse_repair_reply(const std::string& reply, const std::string& finish_reason,
                        repair_reply& out, std::string& error) {
  error.clear();
  std::string text = strip_thinking(reply);
  split_reply parts = split_fences(text);
  // "Cause:", "Fix:" and "GIVE UP:" lines, in the prose only.
  repair_reply r;
  std::string give_up;
  bool gave_up = false;
  size_t pos = 0;
  const std::string& prose = parts.prose;
  while (pos < prose.size()) {
    size_t end = prose.find('\n', pos);
    if (end == std::string::npos)
      end = prose.size();
    std::string line = trim(prose.substr(pos, end - pos));
    while (!line.empty() && (line[0] == '*' || line[0] == '-' || line[0] == '#'))
      line = trim(line.substr(1));  // markdown decoration
    std::string l = lower(line);
    auto after = [&](size_t n) {
      std::string rest = trim(line.substr(n));
      while (!rest.empty() && rest[0] == '*')
        rest = trim(rest.substr(1));
      return rest;
    };
    if (l.rfind("give up:", 0) == 0 || l.rfind("give up**:", 0) == 0) {
      gave_up = true;
      give_up = after(l.find(':') + 1);
    } else if (l.rfind("cause:", 0) == 0 || l.rfind("cause**:", 0) == 0) {
      r.cause = after(l.find(':') + 1);
    } else if (l.rfind("fix:", 0) == 0 || l.rfind("fix**:", 0) == 0) {
      r.fix = after(l.find(':') + 1);
    }
    pos = end + 1;
  }
  if (gave_up) {
    bool has_code = false;
    for (const auto& b : parts.blocks)
      has_code = has_code || (python_tag(b.tag) && defines_workload(b.body));
    if (!has_code) {
      r.gave_up = true;
      r.reason = give_up.empty() ? (r.cause.empty() ? "the model gave up" : r.cause) : give_up;
      out = std::move(r);
      return true;
    }
  }
  code_reply code;
  if (!parse_code_reply(text, finish_reason, code, error)) {
    error += " Before the block, write one line `Cause: ...` (what was wrong) and one line "
             "`Fix: ...` (what you changed); or reply `GIVE UP: reason` without code when no "
             "fix is possible.";
    return false;
  }
  r.source = std::move(code.source);
  out = std::move(r);
  return true;
}

}  // namespace maxkernel::agents::llm
