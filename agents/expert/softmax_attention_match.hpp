// Recognises the forward of softmax attention in the reference's graph, however spelled:
// scores = scale * q . k over head_dim (einsum, dot, @, scale on q, k or the scores, casts),
// an optional mask from indices only (a where() with -inf or a large negative fill, or an
// additive 0/-inf bias), then softmax over the keys (exp(x - max) / sum, jax.nn.softmax's
// or hand-written). The mask is identified by its VALUES at sample points (causal or none),
// so jnp.tril, arange comparisons and triu negations all read the same. Used by templates
// that need the forward's facts (the attention backward).
#pragma once

#include "agents/expert/graph_view.hpp"

#include <string>
#include <vector>

namespace maxkernel::agents::expert::graph_facts {

struct softmax_attention {
  int scores_dot = -1;            // the q . k dot_general
  int probs = -1;                 // the softmax result node
  int numerator = -1;             // its exp(x - max) node (backward passes reuse it)
  int q_input = -1, k_input = -1; // graph inputs
  std::vector<int> batch_dims;    // q's batch dims (stored order of the dot), e.g. {0, 1}
  int seq_dim = -1, head_dim = -1;  // q's sequence and feature dims
  double scale = 1.0;
  bool causal = false;
  int64_t seq_q = 0, seq_k = 0, depth = 0, batch = 1;  // sizes (batch: product of batch dims)
};

// Every softmax attention forward in the graph (usually one).
std::vector<softmax_attention> find_softmax_attention(const graph_view& graph);

// True when `from` reaches `target` walking operands backwards (within `limit` nodes).
bool depends_on(const graph_view& graph, const value_ref& from, int target, int limit = 4000);

}  // namespace maxkernel::agents::expert::graph_facts
