// Follows a value of the reference back through the ops that only relabel or rescale it
// (casts, transposes, multiplication or division by a scalar literal, negation) to where it
// really comes from. Templates use it to see through spellings: x.T @ w, dot(x, w) * 0.5,
// x.astype(f32), einsum's transposes and jax.vjp's casts all reach the same graph input.
#pragma once

#include "agents/expert/graph_view.hpp"

#include <optional>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

struct operand_trace {
  value_ref source;               // where the walk stopped (a graph input or another node)
  std::vector<int> dims;          // per dim of the traced value: the dim of `source` it is
  double scale = 1.0;             // the product of the scalar factors passed
  std::string narrowest;          // the narrowest float dtype the values passed through
                                  // (source's own dtype included): the rounding they carry
  bool through_transpose = false;
};

// The scalar value behind a literal, or a broadcast / cast of one; nullopt otherwise.
std::optional<double> scalar_value(const graph_view& graph, const value_ref& v);

// Walks back from v. Never fails: `source` is v itself when nothing can be passed.
operand_trace trace_operand(const graph_view& graph, const value_ref& v);

// Bytes per element of a dtype name ("bfloat16" -> 2); 4 when unknown.
int dtype_bytes(const std::string& dtype);
bool is_float_dtype(const std::string& dtype);

}  // namespace maxkernel::agents::expert
