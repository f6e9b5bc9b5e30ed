#include "config/dim_expression.hpp"

#include "config/shown_value.hpp"

#include <fmt/format.h>

#include <limits>

namespace maxkernel::config {

namespace {

constexpr int max_depth = 64;  // nested parentheses

bool is_name_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

const char* what_is_allowed = "dims use dim names, integers, + - * // and parentheses";

}  // namespace

// Recursive descent over the grammar
//   expr   := term (('+' | '-') term)*
//   term   := factor (('*' | '//') factor)*
//   factor := INTEGER | NAME | '(' expr ')'
// Every error is thrown as dim_expression_error and caught by parse().
class dim_expression_parser {
public:
  explicit dim_expression_parser(std::string_view text) : text_(text) {}

  dim_expression run() {
    skip_spaces();
    if (pos_ == text_.size())
      fail(pos_, "the expression is empty");
    out_.root_ = expr(0);
    skip_spaces();
    if (pos_ < text_.size()) {
      if (text_[pos_] == ')')
        fail(pos_, "unbalanced ')'");
      if (text_[pos_] == '.')
        fail(pos_, "sizes are integers: no decimal points");
      fail(pos_, fmt::format("expected an operator (+ - * //), got {}", describe_at(pos_)));
    }
    return std::move(out_);
  }

private:
  using op = dim_expression::op;

  [[noreturn]] void fail(size_t offset, std::string message) const {
    throw dim_expression_error{offset, std::move(message)};
  }

  void skip_spaces() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t'))
      ++pos_;
  }

  std::string describe_at(size_t at) const {
    if (at >= text_.size())
      return "the end";
    size_t end = at + 1;
    if (is_name_char(text_[at]))
      while (end < text_.size() && is_name_char(text_[end]))
        ++end;
    return fmt::format("'{}'", shown_value(text_.substr(at, end - at)));
  }

  // Operators that are not in the grammar, named so that the message says what to write.
  void refuse_operator() {
    size_t at = pos_;
    char c = text_[at];
    if (c == '*' && at + 1 < text_.size() && text_[at + 1] == '*')
      fail(at, fmt::format("'**' (power) is not supported; {}", what_is_allowed));
    if (c == '/' && !(at + 1 < text_.size() && text_[at + 1] == '/'))
      fail(at, "'/' is true division; write '//' for integer (floor) division");
    if (c == '%' || c == '<' || c == '>' || c == '&' || c == '|' || c == '^' || c == '~')
      fail(at, fmt::format("'{}' is not supported; {}", c, what_is_allowed));
  }

  int add(dim_expression::node n) {
    out_.nodes_.push_back(std::move(n));
    return static_cast<int>(out_.nodes_.size() - 1);
  }

  int binary(op kind, int lhs, int rhs, size_t at) {
    dim_expression::node n;
    n.kind = kind;
    n.lhs = lhs;
    n.rhs = rhs;
    n.offset = at;
    return add(std::move(n));
  }

  int expr(int depth) {
    int lhs = term(depth);
    for (;;) {
      skip_spaces();
      if (pos_ == text_.size())
        return lhs;
      refuse_operator();
      char c = text_[pos_];
      if (c != '+' && c != '-')
        return lhs;
      size_t at = pos_++;
      lhs = binary(c == '+' ? op::add : op::subtract, lhs, term(depth), at);
    }
  }

  int term(int depth) {
    int lhs = factor(depth);
    for (;;) {
      skip_spaces();
      if (pos_ == text_.size())
        return lhs;
      refuse_operator();
      size_t at = pos_;
      if (text_[at] == '*') {
        ++pos_;
        lhs = binary(op::multiply, lhs, factor(depth), at);
      } else if (text_.substr(at, 2) == "//") {
        pos_ += 2;
        lhs = binary(op::floor_divide, lhs, factor(depth), at);
      } else {
        return lhs;
      }
    }
  }

  int factor(int depth) {
    skip_spaces();
    if (pos_ == text_.size())
      fail(pos_, "the expression ends where a dim name, an integer or '(' should follow");
    size_t at = pos_;
    char c = text_[at];
    if (c == '(') {
      if (depth >= max_depth)
        fail(at, fmt::format("parentheses nested deeper than {}", max_depth));
      ++pos_;
      int inner = expr(depth + 1);
      skip_spaces();
      if (pos_ == text_.size() || text_[pos_] != ')')
        fail(pos_ == text_.size() ? at : pos_,
             pos_ == text_.size() ? std::string("'(' is never closed")
                                  : fmt::format("expected ')', got {}", describe_at(pos_)));
      ++pos_;
      return inner;
    }
    if (is_digit(c)) {
      size_t end = at;
      while (end < text_.size() && is_digit(text_[end]))
        ++end;
      if (end < text_.size() && is_name_char(text_[end]))
        fail(at, fmt::format("{} is neither an integer nor a dim name (names do not start "
                             "with a digit; write 2 * M, not 2M)",
                             describe_at(at)));
      std::string_view digits = text_.substr(at, end - at);
      if (digits.size() > 1 && digits[0] == '0')
        fail(at, fmt::format("'{}': integers do not start with 0 (as in Python)", digits));
      int64_t value = 0;
      for (char d : digits)
        if (__builtin_mul_overflow(value, int64_t{10}, &value) ||
            __builtin_add_overflow(value, int64_t{d - '0'}, &value))
          fail(at, fmt::format("the integer {} does not fit in 64 bits", shown_value(digits)));
      pos_ = end;
      dim_expression::node n;
      n.kind = op::literal;
      n.value = value;
      n.offset = at;
      return add(std::move(n));
    }
    if (is_name_start(c)) {
      size_t end = at;
      while (end < text_.size() && is_name_char(text_[end]))
        ++end;
      std::string name(text_.substr(at, end - at));
      pos_ = end;
      bool seen = false;
      for (const auto& u : out_.names_)
        seen = seen || u.name == name;
      if (!seen)
        out_.names_.push_back({name, at});
      dim_expression::node n;
      n.kind = op::name;
      n.name = std::move(name);
      n.offset = at;
      return add(std::move(n));
    }
    if (c == '-' || c == '+')
      fail(at, fmt::format("a unary '{}' is not supported; {}", c, what_is_allowed));
    if (c == ')')
      fail(at, "unbalanced ')'");
    refuse_operator();
    if (c == '.')
      fail(at, "sizes are integers: no decimal points");
    fail(at, fmt::format("expected a dim name, an integer or '(', got {}; {}", describe_at(at),
                         what_is_allowed));
  }

  std::string_view text_;
  size_t pos_ = 0;
  dim_expression out_;
};

std::optional<int64_t> floor_divide(int64_t a, int64_t b) {
  if (b == 0 || (a == std::numeric_limits<int64_t>::min() && b == -1))
    return std::nullopt;
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0)))
    --q;  // C++ truncates toward zero; Python floors
  return q;
}

std::optional<dim_expression> dim_expression::parse(std::string_view text,
                                                    dim_expression_error& err) {
  if (text.size() > max_length) {
    err = {0, fmt::format("the expression is {} characters long; the limit is {}", text.size(),
                          max_length)};
    return std::nullopt;
  }
  try {
    return dim_expression_parser(text).run();
  } catch (const dim_expression_error& e) {
    err = e;
    return std::nullopt;
  }
}

std::optional<int64_t> dim_expression::evaluate(
    const std::function<int64_t(const std::string&)>& value_of, dim_expression_error& err) const {
  return evaluate(root_, value_of, err);
}

std::optional<int64_t> dim_expression::evaluate(
    int index, const std::function<int64_t(const std::string&)>& value_of,
    dim_expression_error& err) const {
  const node& n = nodes_.at(static_cast<size_t>(index));
  if (n.kind == op::literal)
    return n.value;
  if (n.kind == op::name)
    return value_of(n.name);
  auto a = evaluate(n.lhs, value_of, err);
  if (!a)
    return std::nullopt;
  auto b = evaluate(n.rhs, value_of, err);
  if (!b)
    return std::nullopt;
  int64_t out = 0;
  const char* symbol = "+";
  bool overflow = false;
  switch (n.kind) {
    case op::add: overflow = __builtin_add_overflow(*a, *b, &out); break;
    case op::subtract:
      symbol = "-";
      overflow = __builtin_sub_overflow(*a, *b, &out);
      break;
    case op::multiply:
      symbol = "*";
      overflow = __builtin_mul_overflow(*a, *b, &out);
      break;
    case op::floor_divide: {
      symbol = "//";
      if (*b == 0) {
        err = {n.offset, fmt::format("division by zero ({} // 0)", *a)};
        return std::nullopt;
      }
      auto q = floor_divide(*a, *b);
      overflow = !q;
      out = q.value_or(0);
      break;
    }
    default: break;
  }
  if (overflow) {
    err = {n.offset, fmt::format("{} {} {} does not fit in 64 bits", *a, symbol, *b)};
    return std::nullopt;
  }
  return out;
}

}  // namespace maxkernel::config
