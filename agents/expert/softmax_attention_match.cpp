#include "agents/expert/softmax_attention_match.hpp"

#include "agents/expert/index_evaluator.hpp"
#include "agents/expert/operand_trace.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace maxkernel::agents::expert::graph_facts {

namespace {

// Through the ops that only reshape, broadcast or cast a value.
value_ref strip(const graph_view& g, value_ref v) {
  while (v.is_node()) {
    auto p = g.primitive(v.id);
    if (p == "broadcast_in_dim" || p == "reshape" || p == "stop_gradient" ||
        p == "convert_element_type" || p == "squeeze" || p == "expand_dims" || p == "copy")
      v = g.operand(v.id, 0);
    else
      break;
  }
  return v;
}

bool same_value(const value_ref& a, const value_ref& b) {
  return a.what == b.what && a.id == b.id && a.what != value_ref::kind::literal;
}

// A reduction `prim` of x over its last axis only.
bool last_axis_reduction(const graph_view& g, const value_ref& r, const std::string& prim,
                         const value_ref& x) {
  if (!r.is_node() || g.primitive(r.id) != prim)
    return false;
  auto axes = g.params(r.id).value("axes", std::vector<int>{});
  auto rank = static_cast<int>(g.shape(x).size());
  return axes == std::vector<int>{rank - 1} && same_value(strip(g, g.operand(r.id, 0)), strip(g, x));
}

bool very_negative(const graph_view& g, const value_ref& v) {
  auto s = scalar_value(g, v);
  return s && *s <= -1e9;
}

struct chain {
  int dot = -1;
  double scale = 1.0;
  std::vector<std::pair<value_ref, int>> selects;  // (predicate, case kept when it holds)
  std::vector<value_ref> biases;                    // additive 0 / -inf masks
};

bool score_chain(const graph_view& g, value_ref v, chain& c) {
  index_evaluator ev(g);
  for (int guard = 0; guard < 64 && v.is_node(); ++guard) {
    auto p = g.primitive(v.id);
    if (p == "dot_general") {
      c.dot = v.id;
      return true;
    }
    if (p == "convert_element_type" || p == "copy" || p == "stop_gradient") {
      v = g.operand(v.id, 0);
      continue;
    }
    if ((p == "mul" || p == "div") && g.operand_count(v.id) == 2) {
      auto s1 = scalar_value(g, g.operand(v.id, 1));
      auto s0 = scalar_value(g, g.operand(v.id, 0));
      if (s1 && *s1 != 0 && std::isfinite(*s1)) {
        c.scale *= p == "mul" ? *s1 : 1.0 / *s1;
        v = g.operand(v.id, 0);
        continue;
      }
      if (p == "mul" && s0 && std::isfinite(*s0)) {
        c.scale *= *s0;
        v = g.operand(v.id, 1);
        continue;
      }
      return false;
    }
    if (p == "select_n" && g.operand_count(v.id) == 3) {
      auto pred = g.operand(v.id, 0);
      if (!ev.index_only(pred))
        return false;
      if (very_negative(g, g.operand(v.id, 1))) {
        c.selects.push_back({pred, 1});
        v = g.operand(v.id, 2);
        continue;
      }
      if (very_negative(g, g.operand(v.id, 2))) {
        c.selects.push_back({pred, 0});
        v = g.operand(v.id, 1);
        continue;
      }
      return false;
    }
    if (p == "add" && g.operand_count(v.id) == 2) {
      for (unsigned k = 0; k < 2; ++k)
        if (ev.index_only(g.operand(v.id, k)) && !scalar_value(g, g.operand(v.id, k))) {
          c.biases.push_back(g.operand(v.id, k));
          v = g.operand(v.id, 1 - k);
          goto next;
        }
      return false;
    }
    return false;
  next:;
  }
  return false;
}

// kept(r, c) of the mask at sample points: 0 = no mask, 1 = causal, -1 = something else.
int classify_mask(const graph_view& g, const chain& c, const std::vector<int64_t>& score_shape) {
  if (c.selects.empty() && c.biases.empty())
    return 0;
  index_evaluator ev(g);
  auto rank = score_shape.size();
  int64_t sq = score_shape[rank - 2], sk = score_shape[rank - 1];
  std::set<int64_t> pts = {0, 1, 2, 3, 5, 7, 8, 13, 31, 64, 127, 128, 129, 255, 256, 511, 1000};
  for (int64_t x : {sq - 1, sq - 2, sq / 2, sk - 1, sk / 2 + 1})
    pts.insert(x);
  bool all = true, causal = true;
  for (int corner = 0; corner < 2; ++corner)
    for (int64_t r : pts)
      for (int64_t col : pts) {
        if (r < 0 || col < 0 || r >= sq || col >= sk)
          continue;
        std::vector<int64_t> idx(rank, 0);
        for (size_t i = 0; corner && i + 2 < rank; ++i)
          idx[i] = score_shape[i] - 1;
        idx[rank - 2] = r;
        idx[rank - 1] = col;
        bool keep = true;
        for (const auto& [pred, kept_case] : c.selects) {
          auto v = ev.at(pred, std::vector<int64_t>(idx.begin() + static_cast<long>(rank - g.shape(pred).size()), idx.end()));
          if (!v)
            return -1;
          keep = keep && (static_cast<int>(*v != 0) == kept_case);
        }
        for (const auto& b : c.biases) {
          auto bs = g.shape(b);
          if (bs.size() > rank)
            return -1;
          std::vector<int64_t> bi(idx.begin() + static_cast<long>(rank - bs.size()), idx.end());
          for (size_t i = 0; i < bs.size(); ++i)
            if (bs[i] == 1)
              bi[i] = 0;
          auto v = ev.at(b, bi);
          if (!v)
            return -1;
          if (*v <= -1e9)
            keep = false;
          else if (*v != 0)
            return -1;  // a real bias, not a mask
        }
        all = all && keep;
        causal = causal && keep == (r >= col);
      }
  if (all)
    return 0;
  return causal && sq == sk ? 1 : -1;
}

}  // namespace

bool depends_on(const graph_view& g, const value_ref& from, int target, int limit) {
  if (!from.is_node())
    return false;
  std::vector<int> stack = {from.id};
  std::set<int> seen;
  while (!stack.empty() && limit-- > 0) {
    int id = stack.back();
    stack.pop_back();
    if (id == target)
      return true;
    if (!seen.insert(id).second)
      continue;
    for (unsigned k = 0; k < g.operand_count(id); ++k) {
      auto o = g.operand(id, k);
      if (o.is_node())
        stack.push_back(o.id);
    }
  }
  return false;
}

std::vector<softmax_attention> find_softmax_attention(const graph_view& g) {
  std::vector<softmax_attention> found;
  for (int e : g.find("exp")) {
    if (g.in_loop(e))
      continue;
    auto a = g.operand(e, 0);
    if (!a.is_node() || g.primitive(a.id) != "sub")
      continue;
    auto x = g.operand(a.id, 0);
    auto mx = strip(g, g.operand(a.id, 1));
    // jax.nn.softmax guards the max: max(-inf, reduce_max(x))
    if (mx.is_node() && g.primitive(mx.id) == "max") {
      auto l = g.operand(mx.id, 0), r = g.operand(mx.id, 1);
      mx = very_negative(g, l) ? strip(g, r) : very_negative(g, r) ? strip(g, l) : mx;
    }
    if (!last_axis_reduction(g, mx, "reduce_max", x))
      continue;
    // probs = exp / sum(exp)
    int probs = -1;
    value_ref ev{value_ref::kind::node, e, ""};
    for (int c : g.consumers(e)) {
      if (g.primitive(c) != "div" || !same_value(g.operand(c, 0), ev))
        continue;
      if (last_axis_reduction(g, strip(g, g.operand(c, 1)), "reduce_sum", ev)) {
        probs = c;
        break;
      }
    }
    if (probs < 0)
      continue;
    chain ch;
    if (!score_chain(g, x, ch))
      continue;
    int dot = ch.dot;
    const auto& p = g.params(dot);
    auto lc = p.value("lhs_contracting", std::vector<int>{});
    auto rc = p.value("rhs_contracting", std::vector<int>{});
    auto lb = p.value("lhs_batch", std::vector<int>{});
    auto rb = p.value("rhs_batch", std::vector<int>{});
    if (lc.size() != 1 || rc.size() != 1)
      continue;
    auto tq = trace_operand(g, g.operand(dot, 0));
    auto tk = trace_operand(g, g.operand(dot, 1));
    if (!tq.source.is_input() || !tk.source.is_input() || tq.source.id == tk.source.id)
      continue;
    auto rank = tq.dims.size();
    if (rank != lb.size() + 2 || tk.dims.size() != rank || rb.size() != lb.size())
      continue;
    softmax_attention s;
    s.scores_dot = dot;
    s.probs = probs;
    s.numerator = e;
    s.q_input = tq.source.id;
    s.k_input = tk.source.id;
    bool same_layout = true;
    std::vector<bool> used(rank, false);
    for (size_t i = 0; i < lb.size(); ++i) {
      int dq = tq.dims[static_cast<size_t>(lb[i])], dk = tk.dims[static_cast<size_t>(rb[i])];
      same_layout = same_layout && dq == dk;
      s.batch_dims.push_back(dq);
      used[static_cast<size_t>(dq)] = true;
    }
    s.head_dim = tq.dims[static_cast<size_t>(lc[0])];
    same_layout = same_layout && s.head_dim == tk.dims[static_cast<size_t>(rc[0])];
    used[static_cast<size_t>(s.head_dim)] = true;
    for (size_t d = 0; d < rank; ++d)
      if (!used[d])
        s.seq_dim = static_cast<int>(d);
    // k's free dim must sit where q's does (one layout for both)
    std::set<int> k_used;
    for (int d : rb)
      k_used.insert(tk.dims[static_cast<size_t>(d)]);
    k_used.insert(tk.dims[static_cast<size_t>(rc[0])]);
    same_layout = same_layout && !k_used.count(s.seq_dim);
    if (!same_layout || s.seq_dim < 0)
      continue;
    auto qs = g.shape(tq.source), ks = g.shape(tk.source);
    s.seq_q = qs[static_cast<size_t>(s.seq_dim)];
    s.seq_k = ks[static_cast<size_t>(s.seq_dim)];
    s.depth = qs[static_cast<size_t>(s.head_dim)];
    for (int d : s.batch_dims)
      s.batch *= qs[static_cast<size_t>(d)];
    s.scale = ch.scale * tq.scale * tk.scale;
    int mask = classify_mask(g, ch, g.shape(value_ref{value_ref::kind::node, dot, ""}));
    if (mask < 0)
      continue;
    s.causal = mask == 1;
    found.push_back(s);
  }
  return found;
}

}  // namespace maxkernel::agents::expert::graph_facts
