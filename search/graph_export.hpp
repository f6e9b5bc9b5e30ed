// The search graph for people and tools: JSON (every vertex and edge) and Graphviz DOT (one
// box per vertex with its speedup, failures dashed, the best highlighted), and SVG through
// Graphviz's `dot`.
#pragma once

#include <string>
#include <vector>

namespace maxkernel::search {

// {"reference_time_us", "best", "vertices": [...], "edges": [...], "errors": [...]} from
// encoded schema::Vertex bytes (index order, as search_graph::vertices gives them).
// reference_us <= 0: unknown, and every speedup is null. Bytes that do not decode are left out
// of vertices and named in errors.
std::string graph_json(const std::vector<std::string>& vertex_bytes, double reference_us);

// A `digraph` with node v<index> per vertex, labelled with its index, template, short
// parameters and "1.83x modeled" (or the time when the reference is unknown); best: the vertex
// to highlight, -1 for none.
std::string graph_dot(const std::vector<std::string>& vertex_bytes, double reference_us,
                      int best);

// Runs Graphviz `dot -Tsvg` on dot (from PATH). False with error when dot is not installed,
// fails (its stderr) or does not finish within two minutes.
bool dot_to_svg(const std::string& dot, std::string& svg, std::string& error);

}  // namespace maxkernel::search
