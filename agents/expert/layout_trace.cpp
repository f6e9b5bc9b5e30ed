#include "agents/expert/layout_trace.hpp"

#include <numeric>
#include <set>

namespace maxkernel::agents::expert::graph_facts {

layout_trace trace_layout(const graph_view& g, const value_ref& start) {
  layout_trace out;
  value_ref v = start;
  // map[d] = dim of `start` that dim d of the current value lands on
  std::vector<int> map(g.shape(v).size());
  std::iota(map.begin(), map.end(), 0);
  for (int guard = 0; guard < 64 && v.is_node(); ++guard) {
    auto p = g.primitive(v.id);
    auto in = g.operand(v.id, 0);
    auto ishape = g.shape(in), oshape = g.shape(v);
    std::vector<int> next(ishape.size(), -1);
    if (p == "convert_element_type" || p == "copy" || p == "copy_p" ||
        p == "optimization_barrier") {
      next = map;
    } else if (p == "broadcast_in_dim") {
      auto bd = g.params(v.id).value("broadcast_dimensions", std::vector<int>{});
      if (bd.size() != ishape.size())
        return out;
      for (size_t i = 0; i < ishape.size(); ++i) {
        auto o = static_cast<size_t>(bd[i]);
        next[i] = ishape[i] == oshape[o] ? map[o] : -1;
      }
    } else if (p == "transpose") {
      auto perm = g.params(v.id).value("permutation", std::vector<int>{});
      if (perm.size() != ishape.size())
        return out;
      for (size_t j = 0; j < perm.size(); ++j)
        next[static_cast<size_t>(perm[j])] = map[j];
    } else if (p == "reshape" || p == "squeeze" || p == "expand_dims") {
      // only unit dims may come or go: match the non-unit dims in order
      std::vector<size_t> in_big, out_big;
      for (size_t i = 0; i < ishape.size(); ++i)
        if (ishape[i] != 1)
          in_big.push_back(i);
      for (size_t i = 0; i < oshape.size(); ++i)
        if (oshape[i] != 1)
          out_big.push_back(i);
      if (in_big.size() != out_big.size())
        return out;
      for (size_t k = 0; k < in_big.size(); ++k) {
        if (ishape[in_big[k]] != oshape[out_big[k]])
          return out;
        next[in_big[k]] = map[out_big[k]];
      }
    } else {
      return out;
    }
    map = std::move(next);
    v = in;
  }
  if (v.is_input()) {
    out.input = v.id;
    out.to_value = map;
  }
  return out;
}

bool depends_on_input(const graph_view& g, const value_ref& v, int input, int limit) {
  if (v.is_input())
    return v.id == input;
  if (!v.is_node())
    return false;
  std::vector<int> stack = {v.id};
  std::set<int> seen;
  while (!stack.empty() && limit-- > 0) {
    int id = stack.back();
    stack.pop_back();
    if (!seen.insert(id).second)
      continue;
    for (unsigned k = 0; k < g.operand_count(id); ++k) {
      auto o = g.operand(id, k);
      if (o.is_input() && o.id == input)
        return true;
      if (o.is_node())
        stack.push_back(o.id);
    }
  }
  return false;
}

}  // namespace maxkernel::agents::expert::graph_facts
