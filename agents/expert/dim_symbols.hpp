// Shape-generic sizes for code generated from the reference's graph. The analyze summary is
// traced at the task's full shapes, but a rendered kernel runs at the tester's reduced ones,
// so every size the generated code writes (broadcast shapes, iotas, reshapes, slice bounds)
// must be read from the inputs at trace time. dim_symbols ties each dim of each value to the
// graph inputs' dims by unifying the dims every primitive says are equal (elementwise
// operands, dot_general batch and contracting pairs, broadcast dimensions, ...), products of
// them (reshape merges) or fractions (slices at the half of a dim). A dim tied to nothing is
// a literal only when its size is no input's size (then it cannot be a reduced dim);
// otherwise it is unknown and the caller refuses to generate code for it.
#pragma once

#include "agents/expert/graph_view.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace maxkernel::agents::expert::moe {

class dim_symbols {
public:
  // input_exprs[k]: the Python expression holding graph input k at trace time ("in0").
  dim_symbols(const graph_view& graph, std::vector<std::string> input_exprs);
  // A dim tied to no input by the primitives may still be read from an input dim of the same
  // size when that size is certain to stay equal at reduced shapes: all such input dims carry
  // the same dim name (native specs, names per graph input and axis), or the task is reduced
  // by size value (JAXBench / MaxKernel tasks: equal sizes reduce alike).
  void set_size_names(std::vector<std::vector<std::string>> names, bool by_value);

  // Python expression of dim `axis` of result `result` of node `node` (or of graph input
  // `node` when `input` is true); empty when the dim cannot be tied to the inputs.
  std::string dim_expr(const value_ref& v, int axis, int result = 0) const;
  // "(e0, e1, )" or empty when some dim is unknown.
  std::string shape_expr(const value_ref& v, int result = 0) const;
  // A size of a dim of `v` found in params (a slice bound, a gather slice size): the dim's
  // own expression when it equals the dim's size, "0" for 0, a fraction of the dim for p/q
  // with q <= 8, else the literal when no input has that size; empty when unknown.
  std::string bound_expr(const value_ref& v, int axis, int64_t bound, int result = 0) const;
  // Which result of its producer operand k of `consumer` reads: the summary's operandResults
  // when it says, else (older summaries) the first result whose type equals the operand's;
  // -1 when none does.
  int result_of_operand(int consumer, unsigned k) const;
  // True when some dim of a graph input has this size.
  bool is_input_size(int64_t size) const;

private:
  struct var {
    int64_t size = 0;
    int parent = -1;
    int input = -1, axis = -1;           // a graph input's dim
    std::vector<int> product;            // this dim is the product of those vars
    int frac_of = -1;                    // this dim is frac_num/frac_den of that var
    int64_t frac_num = 1, frac_den = 1;
    bool literal_ok = false;             // a static size (top_k's k)
  };
  int find(int v) const;
  void unite(int a, int b);
  int var_of(const value_ref& v, int axis, int result = 0) const;
  int operand_var(int node, unsigned k, int axis) const;
  void add_rules(int node);
  std::string expr_of(int v, int depth) const;

  const graph_view& graph_;
  std::vector<std::string> input_exprs_;
  mutable std::vector<var> vars_;
  std::vector<int> input_base_;                       // first var of input k
  std::vector<std::vector<int>> node_base_;           // per node, per result: first var
  std::vector<int64_t> input_sizes_;
  std::vector<std::vector<std::string>> names_;
  bool by_value_ = false;
};

}  // namespace maxkernel::agents::expert::moe
