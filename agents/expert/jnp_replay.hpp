// Replays part of the reference's dataflow graph as whole-array jax.lax code around a
// template's pallas_calls (the convolution family's prologue and tail: group norms before or
// after a conv, pools the kernel does not fuse, squeeze-excite, batch statistics).
//
// Sizes are shape-generic, resolved in emission order: every dim belongs to a class of dims
// the primitives say are equal (elementwise operands, broadcast and reduce axes, reshape
// groups, dot and conv batch/feature dims, untouched pool and pad axes); a class is written
// as `<value>.shape[a]` of the first value in it that exists at that point of the code (a
// graph input, a value the kernel computed, an earlier statement), so derived sizes (a conv
// or pool output, a split C -> (G, C/G)) read the arrays that carry them. A reshape may leave
// one unknown part (-1); a size equal to a static integer argument (a group count) stays a
// literal. A float literal that equals the element count of a reduction (jnp.mean, jnp.var)
// becomes that count at trace time. Anything else that is not tied refuses the replay.
#pragma once

#include "agents/expert/graph_view.hpp"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

struct jnp_replay_request {
  std::vector<value_ref> outputs;         // values to compute
  std::map<int, std::string> given;       // node id -> expression of its (array) result
  std::vector<std::string> inputs;        // graph input k -> its expression
  std::vector<int64_t> static_ints;       // static integer arguments: literal sizes
  std::string prefix = "t";               // statement names: <prefix><node id>
};

struct jnp_replay_code {
  std::vector<std::string> lines;         // statements in graph order, unindented
  std::vector<std::string> outputs;       // per requested output: its expression
  std::vector<int> nodes;                 // the replayed nodes
  std::set<std::string> primitives;
  std::string code(int indent_spaces) const;
};

// false with a one-line reason when a node cannot be replayed.
bool build_jnp_replay(const graph_view& graph, const jnp_replay_request& request,
                      jnp_replay_code& out, std::string& reason);

}  // namespace maxkernel::agents::expert
