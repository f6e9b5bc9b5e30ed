// Recognisers shared by the mixture-of-experts and fused-MLP templates (grouped_matmul,
// swiglu_mlp, moe_ffn): the spellings of "row r uses expert ids[r]" (a one-hot of ids, a
// gather of expert weights), exact widening casts, elementwise chains a kernel can fuse as
// its epilogue, and the code that assembles a kernel module around replayed graph work.
#pragma once

#include "agents/expert/dim_symbols.hpp"
#include "agents/expert/graph_view.hpp"
#include "agents/expert/replay_program.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace maxkernel::agents::expert::moe {

// A value's source through casts that lose nothing (a float widened: bf16 -> f32) and copies.
value_ref skip_widening(const graph_view& graph, value_ref v);

// Through the index plumbing jnp adds around integer indices: broadcast to (M, 1), the
// wrap-around of negative indices (select_n(lt(i, 0), i, add(i, n))), integer casts, clamps.
value_ref skip_index_plumbing(const graph_view& graph, value_ref v);

// v (after widening casts) is one_hot(ids, classes) along axis `class_axis` of v: a cast of
// eq(broadcast(ids), iota along class_axis) (jax.nn.one_hot and hand-written forms).
struct one_hot {
  value_ref ids;             // the integer ids (their plumbing skipped)
  int class_axis = -1;       // the classes' axis of the one-hot value
  int64_t classes = 0;
  std::vector<int> nodes;    // the one-hot's own nodes
};
std::optional<one_hot> match_one_hot(const graph_view& graph, value_ref v);

// A value whose every element is W[ids[r], ...] for row r (a gather of W's first axis by the
// rows' ids, or a one-hot of ids contracted with W's expert axis): W is a graph input (or any
// value) of rank 3 with the experts first.
struct selected_weights {
  value_ref weights;         // W [G, a, b]
  value_ref ids;             // [M] per row
  int row_axis = 0;          // the rows' axis of the selected value
  std::vector<int> axes;     // the selected value's axes of W's dims 1 and 2
  std::vector<int> nodes;
};
std::optional<selected_weights> match_selected_weights(const graph_view& graph, value_ref v);

// The node ids from `start` along its single-consumer chain of elementwise nodes (their other
// operands literals or scalar broadcasts of literals, same shape): the fusable epilogue. The
// last one is where the chain ends (start itself when nothing follows).
std::vector<int> elementwise_chain(const graph_view& graph, int start);

// The node h where products a and b meet in an elementwise region (a GLU of two grouped
// products): the region behind h reads only a, b and constants, and no value inside it but h
// is read from outside. The largest such h, or -1.
int elementwise_join(const graph_view& graph, int a, int b);

// Whether a primitive is elementwise (block_mode replay can run it on blocks).
bool is_elementwise(const std::string& primitive);

// Every input of the graph reached backwards from v (through any node).
std::set<int> inputs_reached(const graph_view& graph, value_ref v);

// The graph's outputs as values.
std::vector<value_ref> graph_outputs(const graph_view& graph);

// A Python function `def <name>(<args>):` returning `expr` after the replayed lines.
std::string py_function(const std::string& name, const std::vector<std::string>& args,
                        const replay_code& code, const std::string& result);

// Byte size of a numpy dtype name.
int64_t dtype_bytes(const std::string& dtype);

// Sublane multiple of a block's rows for a dtype (f32 8, bf16 16, int8 32).
int64_t sublane_align(const std::string& dtype);

// The largest of `candidates` (descending) for which fits(value) holds; the smallest if none.
int64_t largest_fitting(const std::vector<int64_t>& candidates,
                        const std::function<bool(int64_t)>& fits);

}  // namespace maxkernel::agents::expert::moe
