// Softmax attention recognised in the reference's graph, whatever its spelling:
//   O = softmax_k(f(sum_t Q_t K_t^T, positions, masks, biases)) V
// with the score function f any elementwise chain (scale, soft-capping, where/-inf masks from
// iotas, additive biases), Q_t/K_t/V read through reshapes, transposes and broadcasts (GQA /
// MQA by reshape or repeat), the softmax written by jax.nn or by hand (max-subtracted or
// not, normalised before or after the PV product), and any layout of the output.
// Everything is expressed over loop indices (loop_index_space): the key index, the row
// indices the kv side shares ("kv rows": batch, kv heads) and those it does not ("q rows":
// query positions, heads of a group), the contraction and value indices.
#pragma once

#include "agents/expert/graph_view.hpp"
#include "agents/expert/loop_index_space.hpp"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

struct attention_term {
  int dot = -1;
  traced_operand q, k;
  index_list contraction;      // leaves
};

// A graph input read by the score function (a mask, a bias, lengths).
struct region_input_use {
  int node = -1;               // the region node reading it
  unsigned operand = 0;
  int input = -1;
  axis_indices axes;           // per input axis
};

struct attention_pattern {
  loop_index_space space;
  value_ref scores;            // S, the softmax's input
  int softmax_axis = -1;
  axis_indices s_axes;
  index_list keys;             // leaves of the softmax axis
  index_list kv_rows;          // row leaves the kv side depends on, in S order
  index_list q_rows;           // row leaves only the query side depends on, in S order
  index_list value_dims;       // V's free leaves
  std::vector<attention_term> terms;
  int pv_dot = -1;
  traced_operand v;
  value_ref out_value;         // the attention result (the graph output, or the value an
                               // epilogue computes the output from)
  int epilogue_from = -1;      // the first node after the attention result, -1 without one
  axis_indices out_axes;
  std::string out_dtype;
  std::string pv_out_dtype;    // the PV dot's result dtype
  std::string p_dtype;         // dtype of the probabilities at the PV dot
  bool deferred_norm = false;  // O = (E V) / sum(E)
  bool max_subtracted = true;
  std::vector<int> region;     // score-function nodes, graph order
  std::map<int, axis_indices> region_axes;
  // An iota read again with another index map (pos[:, None] >= pos[None, :] over one
  // arange): (reader node, operand) -> the map of that read; the first read is in region_axes.
  std::map<std::pair<int, unsigned>, axis_indices> iota_reads;
  std::vector<region_input_use> region_inputs;
  std::vector<int> attention_nodes;  // every node the pattern accounts for
};

// nullopt with `why` when the graph is not (exactly) one softmax attention.
std::optional<attention_pattern> find_attention(const graph_view& g, std::string& why);

// The role of a leaf: "key", "kv_row", "q_row", "contraction", "value", or "".
std::string leaf_role(const attention_pattern& p, int leaf);

}  // namespace maxkernel::agents::expert
