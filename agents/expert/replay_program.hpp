// Replays a part of the reference's dataflow graph as jax.lax calls: the light work a
// kernel module keeps as XLA ops around its pallas_calls (MoE routing, the expert ids of a
// gathered-weights spelling, a trailing cast), or, in block mode, an elementwise chain
// evaluated on blocks inside a kernel (the gate of a GLU). Sizes come from dim_symbols, so
// the code runs at the tester's reduced shapes. Nodes given by the caller (the results the
// kernels compute) are not replayed; only what the requested outputs need is emitted.
#pragma once

#include "agents/expert/dim_symbols.hpp"
#include "agents/expert/graph_view.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace maxkernel::agents::expert::moe {

struct replay_request {
  std::vector<value_ref> outputs;         // values to compute
  std::map<int, std::string> given;       // node id -> expression of its result, computed elsewhere
  std::map<int, std::string> statements;  // given node id -> the statement computing it, emitted
                                          // at the node's place in graph order
  std::vector<std::string> inputs;        // graph input k -> its expression
  // Block mode: inside a kernel; elementwise primitives, casts and scalar broadcasts only,
  // floats computed in f32 (a cast to a narrower float is a rounding round trip), no
  // graph inputs (only `given` values and literals).
  bool block_mode = false;
  std::string prefix = "v";               // variable names: <prefix><node id>
};

struct replay_code {
  std::vector<std::string> lines;         // statements in graph order, unindented
  std::vector<std::string> outputs;       // per requested output: its expression
  std::vector<int> nodes;                 // the replayed nodes
  std::set<std::string> primitives;
  double flops = 0;                       // of the replayed nodes (analyze's count)
  std::string code(int indent_spaces) const;
};

// false with a one-line reason when some node cannot be replayed (a loop body, an unknown
// primitive, a size not tied to the inputs, an ambiguous result of a multi-result node).
bool build_replay(const graph_view& graph, const dim_symbols& dims, const replay_request& request,
                  replay_code& out, std::string& reason);

// The Python dtype expression for a numpy dtype name ("bfloat16" -> "jnp.bfloat16").
std::string py_dtype(const std::string& dtype);

// Helper definitions the outside-mode code calls (_rsum, _rmax, ...): put once in a module.
const std::string& replay_prelude();

}  // namespace maxkernel::agents::expert::moe
