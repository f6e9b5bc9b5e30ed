#include "search/evaluation_key.hpp"

#include "messages/content_hash.hpp"


namespace maxkernel::search {

namespace {

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

}  // namespace

std::string normalize_source(std::string_view source) {
  // One pass into the output (each line's trailing whitespace cut as the line ends): a key
  // is made for every request a node gets, so no per-line strings.
  std::string out;
  out.reserve(source.size() + 1);
  size_t line_start = 0;
  python_scanner scanner;
  auto end_line = [&] {
    // Whether the newline ending this line lies inside a triple-quoted string is the state
    // before the newline is fed.
    if (!scanner.newline_in_long_string()) {
      size_t end = out.size();
      while (end > line_start && is_line_space(out[end - 1]))
        --end;
      if (!(end > line_start && out[end - 1] == '\\'))
        out.resize(end);
    }
    out += '\n';
    line_start = out.size();
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
      out += c;
      scanner.feed(c);
    }
  }
  if (out.size() > line_start)
    end_line();
  // Trailing empty lines go.
  while (!out.empty() && out.back() == '\n' && (out.size() == 1 || out[out.size() - 2] == '\n'))
    out.pop_back();
  return out;
}

std::string evaluation_key(const evaluation_key_parts& parts) {
  return evaluation_key(evaluation_key_prefix(parts.reference, normalize_source(parts.source)),
                        parts);
}

messages::sha256_stream evaluation_key_prefix(bool reference, std::string_view normalized) {
  // The first part names the key's own format: changing what goes in changes every key.
  messages::sha256_stream hash;
  std::string bytes;
  messages::append_part(bytes, "maxkernel.evaluation_key.v1");
  messages::append_part(bytes, reference ? "reference" : "candidate");
  bytes += std::to_string(normalized.size());
  bytes += ':';
  hash.update(bytes);
  hash.update(normalized);
  return hash;
}

std::string evaluation_key(const messages::sha256_stream& prefix,
                           const evaluation_key_parts& parts) {
  std::string bytes;
  messages::append_part(bytes, parts.spec_hash);
  messages::append_part(bytes, parts.chip);
  messages::append_part(bytes, parts.backend);
  messages::append_part(bytes, parts.jax_version);
  messages::append_part(bytes, parts.options);
  // After the others and only when given: keys without it are the ones made before it.
  if (!parts.evaluator.empty())
    messages::append_part(bytes, parts.evaluator);
  auto hash = prefix;
  hash.update(bytes);
  return hash.hex();
}

}  // namespace maxkernel::search
