// Where the dims of a graph input land in a value computed from it by casts, broadcasts,
// transposes and unit-dim reshapes: the question "which axis of x is dt's head axis" asked
// of A[None, None, :] * dt, dt[..., None] * x or an einsum's transposes. Templates that take
// several inputs with related axes (state-space scans) read their layouts from it instead
// of assuming one.
#pragma once

#include "agents/expert/graph_view.hpp"

#include <vector>

namespace maxkernel::agents::expert::graph_facts {

struct layout_trace {
  int input = -1;                // the graph input reached (-1: none)
  std::vector<int> to_value;     // per input dim: the dim of the value it lands on (-1: dropped
                                 // as a unit dim)
};

// Walks back from v through convert_element_type, copy, broadcast_in_dim, transpose,
// squeeze/expand_dims/reshape that only add or drop unit dims.
layout_trace trace_layout(const graph_view& graph, const value_ref& v);

// True when v reaches graph input `input` walking operands back (within `limit` nodes).
bool depends_on_input(const graph_view& graph, const value_ref& v, int input, int limit = 20000);

}  // namespace maxkernel::agents::expert::graph_facts
