// The elementwise work right after a kernel's products, fused into the kernel's store: the
// longest chain that block_program can generate (bias and residual inputs become extra
// kernel operands), else an elementwise-only replay on blocks (it also reads multi-result
// seeds, such as the two halves of a jnp.split), else nothing (the store only casts). The
// generated Python function is
//
//   def <name>(accs, extras, offsets, extents):  # -> one f32 / int32 / bool block
//
// accs: the kernel's f32 accumulators, one per seed (rounded first to the seed's dtype when
// the reference holds that product in a narrower float); extras, offsets, extents as in
// block_program.hpp.
#pragma once

#include "agents/expert/block_program.hpp"
#include "agents/expert/dim_symbols.hpp"
#include "agents/expert/graph_view.hpp"

#include <set>
#include <string>
#include <vector>

namespace maxkernel::agents::expert::moe {

struct epilogue_request {
  std::vector<space_axis> space;
  std::vector<block_seed> seeds;     // one per accumulator
  std::vector<int> ends;             // candidate last nodes, farthest first
  std::string name = "_epilogue";
};

struct fused_epilogue {
  std::string code;
  std::vector<block_operand> extras;
  int end = -1;                      // the graph value the function computes
  std::string dtype;                 // its reference dtype
  std::set<std::string> primitives;
  std::string how;                   // "block_program", "replay", "none"
};

// Candidate ends after `start`: its single-consumer chain of nodes of the same shape (the
// first graph output ends it), farthest first, `start` itself last.
std::vector<int> chain_ends(const graph_view& graph, int start);

// Always succeeds with at least the trivial epilogue (ends.back() must be a seed's node or
// the seeds are returned as they are); `notes` says what was refused on the way.
fused_epilogue build_fused_epilogue(const graph_view& graph, const dim_symbols& dims,
                                    const epilogue_request& request, std::string& notes);

}  // namespace maxkernel::agents::expert::moe
