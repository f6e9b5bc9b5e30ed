// An integer expression over named dims (`SEQ_BOUNDS: MAX_SEQS + 1`, `HALF: D // 2`): dim
// names, decimal integers, + - * // (floor division, as Python's) and parentheses, nothing
// else. Parsed here rather than handed to Python so that a spec is checked at load time and
// the worker can recompute the same value from reduced dims with an equally small evaluator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace maxkernel::config {

// What is wrong and where: `offset` is the 0-based character offset into the expression.
struct dim_expression_error {
  size_t offset = 0;
  std::string message;
};

class dim_expression {
public:
  static constexpr size_t max_length = 1000;  // keeps the recursive descent shallow

  // The expression, or nullopt with `err` set (syntax, an unsupported operator, too long).
  static std::optional<dim_expression> parse(std::string_view text, dim_expression_error& err);

  // The dim names it reads, each once, in order of first use, with that use's offset.
  struct name_use {
    std::string name;
    size_t offset = 0;
  };
  const std::vector<name_use>& names() const { return names_; }

  // Its value, `value_of` giving each name's; nullopt with `err` set on division by zero or
  // a result outside 64 bits (at any step).
  std::optional<int64_t> evaluate(const std::function<int64_t(const std::string&)>& value_of,
                                  dim_expression_error& err) const;

private:
  enum class op { literal, name, add, subtract, multiply, floor_divide };
  struct node {
    op kind = op::literal;
    int64_t value = 0;  // literal
    std::string name;   // name
    int lhs = -1, rhs = -1;
    size_t offset = 0;  // of the token (leaves) or the operator (binary nodes)
  };
  friend class dim_expression_parser;

  std::optional<int64_t> evaluate(int index,
                                  const std::function<int64_t(const std::string&)>& value_of,
                                  dim_expression_error& err) const;

  std::vector<node> nodes_;
  int root_ = -1;
  std::vector<name_use> names_;
};

// Python's `a // b` (rounds toward negative infinity); nullopt on b == 0 or overflow.
std::optional<int64_t> floor_divide(int64_t a, int64_t b);

}  // namespace maxkernel::config
