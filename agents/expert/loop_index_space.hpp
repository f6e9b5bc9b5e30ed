// The iteration space of a contraction-shaped computation (attention, matmul chains) read off
// the reference's graph: every axis of a value is a list of loop indices (major to minor), so
// that the same index can be recognised through reshapes, transposes and broadcasts whatever
// layout the reference chose. A reshape that splits an index refines it into sub-indices
// everywhere (a query-head index becomes kv head x group when the reference reshapes heads).
// Unit axes carry no index: a size-1 axis does not change the computation.
#pragma once

#include "agents/expert/graph_view.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

using index_list = std::vector<int>;        // index ids, major to minor
using axis_indices = std::vector<index_list>;  // per axis of a value

class loop_index_space {
public:
  int make(int64_t size);
  int64_t size(int id) const { return indices_[static_cast<size_t>(id)].size; }
  int count() const { return static_cast<int>(indices_.size()); }
  bool is_leaf(int id) const { return indices_[static_cast<size_t>(id)].children.empty(); }
  // Splits a leaf into (major, size / major); false when major does not divide it.
  bool refine(int id, int64_t major);
  // The leaves an index list stands for now (refinements applied).
  index_list expand(const index_list& ids) const;
  axis_indices expand(const axis_indices& axes) const;
  int64_t product(const index_list& ids) const;

  // Cuts `seq` (expanded) into consecutive groups whose sizes are `sizes` (a size-1 entry gets
  // an empty group), refining a leaf where a boundary falls inside it. false when the sizes
  // do not factor the sequence.
  bool partition(const index_list& seq, const std::vector<int64_t>& sizes, axis_indices& groups);

private:
  struct index {
    int64_t size = 1;
    std::vector<int> children;
  };
  std::vector<index> indices_;
};

// One operand of the computation traced back to where its data lives: a graph input or the
// result of a node the walk cannot see through, with the indices of each of its axes, and
// the elementwise operations with scalar constants met on the way (applied base to use).
struct traced_operand {
  value_ref base;
  axis_indices axes;          // per axis of the base (indices the operand is broadcast over
                              // appear nowhere)
  std::vector<int> preops;    // node ids in application order
  std::vector<int> layout;    // layout node ids passed (reshape, transpose, broadcast)
};

// Primitives that only move data (reshape, transpose, broadcast_in_dim, squeeze, expand_dims).
bool is_layout_primitive(const std::string& primitive);
// Elementwise primitives (one result element per operand element, same shapes).
bool is_elementwise_primitive(const std::string& primitive);

// True when the value is a scalar computed from literals only (sqrt(64.0).astype(bf16)).
bool is_constant_scalar(const graph_view& g, const value_ref& v);
// A constant scalar broadcast to a shape (jnp.full, -inf masks): the scalar, else unknown.
value_ref constant_scalar_behind(const graph_view& g, const value_ref& v);

// The operand indices of one layout or elementwise node given its result's indices;
// nullopt when the node cannot be seen through (or a reshape does not factor).
std::optional<axis_indices> operand_indices(const graph_view& g, loop_index_space& space,
                                            int node, unsigned operand,
                                            const axis_indices& result);
// The result indices of a layout or elementwise node given operand `k`'s indices.
std::optional<axis_indices> result_indices(const graph_view& g, loop_index_space& space,
                                           int node, unsigned operand,
                                           const axis_indices& operand_axes);

// Walks back from `v` (with these indices) through layout ops, casts and elementwise ops
// with constant scalars to its base.
std::optional<traced_operand> trace_back(const graph_view& g, loop_index_space& space,
                                         value_ref v, axis_indices axes);

// The indices of a dot_general's operands given its result's: batch axes share the result's,
// free axes take theirs, contracting axes get fresh indices (`contracting` receives them).
bool dot_operand_indices(const graph_view& g, loop_index_space& space, int dot,
                         const axis_indices& result, axis_indices& lhs, axis_indices& rhs,
                         index_list& contracting);

// Fresh indices for every axis of `shape` (none for unit axes).
axis_indices fresh_indices(loop_index_space& space, const std::vector<int64_t>& shape);

}  // namespace maxkernel::agents::expert
