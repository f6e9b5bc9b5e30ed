// normalize_source against the line-by-line implementation it replaced (kept here as the
// reference): every stored evaluation key depends on its output, so random Python-like
// sources (quotes, triple quotes, comments, backslashes, CR/LF, trailing blanks) must
// normalise to the same bytes.
#include "search/evaluation_key.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace maxkernel::search {
namespace {

namespace reference {

bool is_line_space(char c) { return c == ' ' || c == '\t' || c == '\f'; }

// Where a line of Python ends, as far as trailing whitespace is concerned. Inside a
// triple-quoted string trailing spaces are part of the string's value; after a backslash they
// turn "continuation" into a syntax error. Either way they must stay.
class python_scanner {
public:
  // True while inside a triple-quoted string: a newline now is part of the string.
  bool newline_in_long_string() const { return state_ == state::long_string; }

  // Feeds one character; newlines are already '\n'.
  void feed(char c) {
    if (escaped_) {  // the character after a backslash in a string never ends it
      escaped_ = false;
      return;
    }
    switch (state_) {
      case state::code:
        if (c == '#') {
          state_ = state::comment;
        } else if (c == '\'' || c == '"') {
          quote_ = c;
          run_ = 1;
          state_ = state::opening;
        }
        break;
      case state::comment:
        if (c == '\n')
          state_ = state::code;
        break;
      case state::opening:  // counting quotes: '' is empty, ''' opens a long string
        if (c == quote_ && run_ < 3) {
          if (++run_ == 3) {
            state_ = state::long_string;
            run_ = 0;
          }
          break;
        }
        if (run_ == 2) {  // an empty short string; c is code again
          state_ = state::code;
          feed(c);
          break;
        }
        state_ = state::short_string;
        feed(c);
        break;
      case state::short_string:
        if (c == '\\')
          escaped_ = true;
        else if (c == quote_ || c == '\n')  // an unterminated string ends at the line
          state_ = state::code;
        break;
      case state::long_string:
        if (c == '\\') {
          escaped_ = true;
          run_ = 0;
        } else if (c == quote_) {
          if (++run_ == 3) {
            state_ = state::code;
            run_ = 0;
          }
        } else {
          run_ = 0;
        }
        break;
    }
  }

private:
  enum class state { code, comment, opening, short_string, long_string };
  state state_ = state::code;
  char quote_ = 0;
  int run_ = 0;
  bool escaped_ = false;
};
std::string normalize(std::string_view source) {
  std::vector<std::string> lines;
  std::string line;
  python_scanner scanner;
  auto end_line = [&] {
    // Whether the newline ending this line lies inside a triple-quoted string is the state
    // before the newline is fed.
    bool keep = scanner.newline_in_long_string();
    if (!keep) {
      size_t end = line.size();
      while (end > 0 && is_line_space(line[end - 1]))
        --end;
      keep = end > 0 && line[end - 1] == '\\';
      if (!keep)
        line.resize(end);
    }
    lines.push_back(std::move(line));
    line.clear();
  };
  for (size_t i = 0; i < source.size(); ++i) {
    char c = source[i];
    if (c == '\r') {  // \r\n and a lone \r are both one newline to Python
      if (i + 1 < source.size() && source[i + 1] == '\n')
        ++i;
      c = '\n';
    }
    if (c == '\n') {
      end_line();
      scanner.feed('\n');
    } else {
      line += c;
      scanner.feed(c);
    }
  }
  if (!line.empty())
    end_line();
  while (!lines.empty() && lines.back().empty())
    lines.pop_back();
  std::string out;
  for (const auto& l : lines) {
    out += l;
    out += '\n';
  }
  return out;
}

}  // namespace reference

TEST(NormalizeSource, SameBytesAsTheLineByLineReference) {
  const std::vector<std::string> pieces = {
    "a", "x = 1", " ", "\t", "\f", "  ", "\n", "\r\n", "\r", "#", "# c ", "'", "\"", "'''",
    "\"\"\"", "\\", "\\\n", "''", "\"\"", "def f():", "    return 1", "s = '''", "\\'"};
  std::mt19937 rng(11);
  for (int n = 0; n < 20000; ++n) {
    std::string src;
    int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i)
      src += pieces[rng() % pieces.size()];
    ASSERT_EQ(normalize_source(src), reference::normalize(src)) << "source: " << src;
  }
}

}  // namespace
}  // namespace maxkernel::search
