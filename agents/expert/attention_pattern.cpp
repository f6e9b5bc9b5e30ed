#include "agents/expert/attention_pattern.hpp"

#include <algorithm>
#include <set>

namespace maxkernel::agents::expert {

namespace {

value_ref node_ref(int id) {
  value_ref v;
  v.what = value_ref::kind::node;
  v.id = id;
  return v;
}

bool same_value(const value_ref& a, const value_ref& b) {
  return a.what == b.what && a.id == b.id && a.what != value_ref::kind::unknown;
}

std::vector<int> int_list(const nlohmann::json& j) {
  std::vector<int> out;
  if (j.is_array())
    for (const auto& x : j)
      if (x.is_number_integer())
        out.push_back(x.get<int>());
  return out;
}

// Skips casts, copies and stop_gradient backwards.
value_ref strip(const graph_view& g, value_ref v, std::vector<int>* passed = nullptr) {
  while (v.is_node()) {
    auto p = g.primitive(v.id);
    if (p != "convert_element_type" && p != "stop_gradient" && p != "copy" && p != "copy_p" &&
        p != "reduce_precision" && p != "optimization_barrier")
      break;
    if (passed)
      passed->push_back(v.id);
    v = g.operand(v.id, 0);
  }
  return v;
}

// Skips layout ops and casts backwards (a keepdims broadcast of a row reduction).
value_ref strip_layout(const graph_view& g, value_ref v, std::vector<int>* passed) {
  while (v.is_node()) {
    auto p = g.primitive(v.id);
    if (!is_layout_primitive(p) && p != "convert_element_type" && p != "stop_gradient" &&
        p != "copy" && p != "copy_p")
      break;
    if (passed)
      passed->push_back(v.id);
    v = g.operand(v.id, 0);
  }
  return v;
}

bool is_neg_inf_literal(const value_ref& v) {
  return v.is_literal() && (v.literal == "\"-inf\"" || v.literal == "-inf");
}

// The operand index of `node` that reads value `v`, or -1.
int operand_reading(const graph_view& g, int node, const value_ref& v) {
  for (unsigned k = 0; k < g.operand_count(node); ++k)
    if (same_value(g.operand(node, k), v))
      return static_cast<int>(k);
  return -1;
}

struct softmax_match {
  value_ref s;
  int axis = -1;
  int exp = -1;
  int sum = -1;
  value_ref p;                 // the (possibly unnormalised) probabilities
  bool deferred = false;
  bool max_subtracted = false;
  std::vector<int> nodes;
};

// reduce_max(src, axis) behind keepdims broadcasts, stop_gradient and max(-inf, .).
bool row_max_of(const graph_view& g, value_ref b, int& axis, value_ref& src,
                std::vector<int>& nodes) {
  b = strip_layout(g, b, &nodes);
  if (b.is_node() && g.primitive(b.id) == "max") {
    auto a0 = g.operand(b.id, 0), a1 = g.operand(b.id, 1);
    nodes.push_back(b.id);
    if (is_neg_inf_literal(a0))
      b = a1;
    else if (is_neg_inf_literal(a1))
      b = a0;
    else
      return false;
    b = strip_layout(g, b, &nodes);
  }
  if (!b.is_node() || g.primitive(b.id) != "reduce_max")
    return false;
  auto axes = int_list(g.params(b.id).value("axes", nlohmann::json()));
  if (axes.size() != 1)
    return false;
  nodes.push_back(b.id);
  axis = axes[0];
  src = g.operand(b.id, 0);
  return true;
}

// The reduce_sum over `axis` of `e` (or of a cast of it) among e's consumers.
int row_sum_of(const graph_view& g, int e, int& axis, std::vector<int>& nodes) {
  std::vector<int> frontier = {e};
  for (size_t i = 0; i < frontier.size(); ++i) {
    for (int c : g.consumers(frontier[i])) {
      auto p = g.primitive(c);
      if (p == "convert_element_type") {
        frontier.push_back(c);
      } else if (p == "reduce_sum") {
        auto axes = int_list(g.params(c).value("axes", nlohmann::json()));
        if (axes.size() == 1 && (axis < 0 || axes[0] == axis)) {
          axis = axes[0];
          nodes.insert(nodes.end(), frontier.begin() + 1, frontier.begin() + static_cast<long>(i) + 1);
          nodes.push_back(c);
          return c;
        }
      }
    }
  }
  return -1;
}

// True when `y` is the row sum broadcast back (optionally inverted when `inverse`).
bool is_sum_broadcast(const graph_view& g, value_ref y, int sum, bool inverse,
                      std::vector<int>& nodes) {
  y = strip_layout(g, y, &nodes);
  if (inverse) {
    if (!y.is_node())
      return false;
    auto p = g.primitive(y.id);
    if (p == "div" && g.operand(y.id, 0).is_literal() &&
        g.operand(y.id, 0).literal.find('1') != std::string::npos) {
      nodes.push_back(y.id);
      y = g.operand(y.id, 1);
    } else if (p == "integer_pow" && g.params(y.id).value("y", 0) == -1) {
      nodes.push_back(y.id);
      y = g.operand(y.id, 0);
    } else if (p == "reciprocal") {
      nodes.push_back(y.id);
      y = g.operand(y.id, 0);
    } else {
      return false;
    }
    y = strip_layout(g, y, &nodes);
  }
  return y.is_node() && y.id == sum;
}

std::optional<softmax_match> match_softmax(const graph_view& g, int e) {
  softmax_match m;
  m.exp = e;
  m.nodes.push_back(e);
  value_ref x = g.operand(e, 0);
  if (x.is_node() && g.primitive(x.id) == "sub") {
    value_ref a = g.operand(x.id, 0);
    int axis = -1;
    value_ref src;
    std::vector<int> nodes;
    if (row_max_of(g, g.operand(x.id, 1), axis, src, nodes) &&
        same_value(strip(g, src), strip(g, a))) {
      m.s = a;
      m.axis = axis;
      m.max_subtracted = true;
      m.nodes.push_back(x.id);
      m.nodes.insert(m.nodes.end(), nodes.begin(), nodes.end());
      // the casts between the max's source and the scores belong to the softmax too
      std::vector<int> casts;
      strip(g, src, &casts);
      for (int c : casts)
        if (!(a.is_node() && c == a.id))
          m.nodes.push_back(c);
    }
  }
  if (!m.s.is_node() && !m.s.is_input())
    m.s = x;
  int axis = m.axis;
  m.sum = row_sum_of(g, e, axis, m.nodes);
  if (m.sum < 0)
    return std::nullopt;
  m.axis = axis;
  // normalisation: e / sum, or e * (1 / sum), or deferred after the PV product
  for (int c : g.consumers(e)) {
    auto p = g.primitive(c);
    std::vector<int> nodes;
    if (p == "div" && g.operand(c, 0).is_node() && g.operand(c, 0).id == e &&
        is_sum_broadcast(g, g.operand(c, 1), m.sum, false, nodes)) {
      m.p = node_ref(c);
    } else if (p == "mul") {
      int k = operand_reading(g, c, node_ref(e));
      if (k >= 0 && is_sum_broadcast(g, g.operand(c, 1 - static_cast<unsigned>(k)), m.sum, true, nodes))
        m.p = node_ref(c);
    }
    if (m.p.is_node()) {
      m.nodes.push_back(c);
      m.nodes.insert(m.nodes.end(), nodes.begin(), nodes.end());
      break;
    }
  }
  if (!m.p.is_node()) {
    m.p = node_ref(e);
    m.deferred = true;
  }
  return m;
}

class finder {
public:
  finder(const graph_view& g, attention_pattern& p) : g_(g), p_(p) {}

  bool walk_region(value_ref v, const axis_indices& axes, std::string& why) {
    if (v.is_literal())
      return true;
    if (v.is_input()) {
      why = "the scores are a graph input";
      return false;
    }
    if (!v.is_node()) {
      why = "a score operand of unknown origin";
      return false;
    }
    int id = v.id;
    auto it = p_.region_axes.find(id);
    if (it != p_.region_axes.end()) {
      if (p_.space.expand(it->second) != p_.space.expand(axes)) {
        why = "a score-function value is read with two different index maps";
        return false;
      }
      return true;
    }
    p_.region_axes[id] = axes;
    auto prim = g_.primitive(id);
    if (g_.in_loop(id)) {
      why = "the score function runs inside a loop";
      return false;
    }
    if (prim == "dot_general") {
      dots_.push_back(id);
      return true;
    }
    p_.region.push_back(id);
    if (prim == "iota")
      return true;
    if (!is_elementwise_primitive(prim) && !is_layout_primitive(prim)) {
      why = "the score function uses " + prim;
      return false;
    }
    for (unsigned k = 0; k < g_.operand_count(id); ++k) {
      auto o = g_.operand(id, k);
      if (o.is_literal())
        continue;
      auto ops = operand_indices(g_, p_.space, id, k, axes);
      if (!ops) {
        why = "cannot follow the indices through " + prim;
        return false;
      }
      if (o.is_input()) {
        p_.region_inputs.push_back({id, k, o.id, *ops});
        continue;
      }
      if (o.is_node() && g_.primitive(o.id) == "iota") {
        auto seen = p_.region_axes.find(o.id);
        if (seen != p_.region_axes.end() &&
            p_.space.expand(seen->second) != p_.space.expand(*ops)) {
          p_.iota_reads[{id, k}] = *ops;   // positions: each read is its own index map
          continue;
        }
      }
      if (!walk_region(o, *ops, why))
        return false;
    }
    return true;
  }

  // Follows the unique consumer chain of layout ops and casts from `v`; stops at the first
  // other consumer (returned in `stop`, -1 at a graph output without consumers).
  bool forward(value_ref& v, axis_indices& axes, std::string& dtype, int& stop,
               std::vector<int>& passed, std::string& why, const std::set<int>& ignore = {}) {
    while (true) {
      if (!v.is_node()) {
        stop = -1;
        return true;
      }
      std::vector<int> cons;
      for (int c : g_.consumers(v.id))
        if (!ignore.count(c))
          cons.push_back(c);
      if (cons.empty()) {
        stop = -1;
        return true;
      }
      if (cons.size() != 1) {
        why = "an attention value has several consumers";
        return false;
      }
      int c = cons[0];
      auto prim = g_.primitive(c);
      bool layout = is_layout_primitive(prim) && prim != "broadcast_in_dim";
      if (!layout && prim != "convert_element_type" && prim != "copy" && prim != "copy_p" &&
          prim != "reduce_precision") {
        stop = c;
        return true;
      }
      int k = operand_reading(g_, c, v);
      auto res = result_indices(g_, p_.space, c, static_cast<unsigned>(k), axes);
      if (!res) {
        why = "cannot follow the indices through " + prim;
        return false;
      }
      axes = *res;
      passed.push_back(c);
      v = node_ref(c);
      dtype = g_.dtype(v);
    }
  }

  const std::vector<int>& dots() const { return dots_; }

private:
  const graph_view& g_;
  attention_pattern& p_;
  std::vector<int> dots_;
};

bool contains(const index_list& l, int x) { return std::find(l.begin(), l.end(), x) != l.end(); }

index_list leaves_of(const axis_indices& axes) {
  index_list out;
  for (const auto& a : axes)
    out.insert(out.end(), a.begin(), a.end());
  return out;
}

std::optional<attention_pattern> find_with_softmax(const graph_view& g, const softmax_match& sm,
                                                   std::string& why) {
  attention_pattern p;
  p.scores = sm.s;
  p.softmax_axis = sm.axis;
  p.deferred_norm = sm.deferred;
  p.max_subtracted = sm.max_subtracted;
  p.attention_nodes = sm.nodes;
  auto s_shape = g.shape(sm.s);
  if (sm.axis < 0 || static_cast<size_t>(sm.axis) >= s_shape.size() || s_shape[static_cast<size_t>(sm.axis)] <= 1) {
    why = "softmax over a unit axis";
    return std::nullopt;
  }
  p.s_axes = fresh_indices(p.space, s_shape);
  finder f(g, p);
  if (!f.walk_region(sm.s, p.s_axes, why))
    return std::nullopt;
  if (f.dots().empty()) {
    why = "no query-key product feeds the softmax";
    return std::nullopt;
  }
  // the probabilities into the PV product
  value_ref cur = sm.p;
  axis_indices cur_axes = p.s_axes;
  std::string dtype = g.dtype(cur);
  int stop = -1;
  std::vector<int> passed;
  std::set<int> softmax_nodes(sm.nodes.begin(), sm.nodes.end());
  if (!f.forward(cur, cur_axes, dtype, stop, passed, why, softmax_nodes))
    return std::nullopt;
  p.attention_nodes.insert(p.attention_nodes.end(), passed.begin(), passed.end());
  if (stop < 0 || g.primitive(stop) != "dot_general") {
    why = "the probabilities do not feed a dot_general";
    return std::nullopt;
  }
  p.pv_dot = stop;
  p.p_dtype = g.dtype(cur);
  int pk = operand_reading(g, stop, cur);
  if (pk < 0) {
    why = "PV product operand not found";
    return std::nullopt;
  }
  const auto& dp = g.params(stop);
  auto lc = int_list(dp.value("lhs_contracting", nlohmann::json()));
  auto rc = int_list(dp.value("rhs_contracting", nlohmann::json()));
  auto lb = int_list(dp.value("lhs_batch", nlohmann::json()));
  auto rb = int_list(dp.value("rhs_batch", nlohmann::json()));
  const auto& pc = pk == 0 ? lc : rc;
  const auto& vc = pk == 0 ? rc : lc;
  const auto& pb = pk == 0 ? lb : rb;
  const auto& vb = pk == 0 ? rb : lb;
  auto keys = p.space.expand(p.s_axes[static_cast<size_t>(sm.axis)]);
  cur_axes = p.space.expand(cur_axes);
  if (pc.size() != 1 || p.space.expand(cur_axes[static_cast<size_t>(pc[0])]) != keys) {
    why = "the PV product does not contract the softmax axis";
    return std::nullopt;
  }
  value_ref vref = g.operand(stop, static_cast<unsigned>(1 - pk));
  auto vshape = to_vector(g.node(stop).getOperands()[static_cast<unsigned>(1 - pk)].getShape());
  axis_indices v_axes(vshape.size());
  for (size_t i = 0; i < pb.size(); ++i)
    v_axes[static_cast<size_t>(vb[i])] = cur_axes[static_cast<size_t>(pb[i])];
  v_axes[static_cast<size_t>(vc[0])] = cur_axes[static_cast<size_t>(pc[0])];
  for (size_t a = 0; a < vshape.size(); ++a) {
    bool used = contains(std::vector<int>(vb.begin(), vb.end()), static_cast<int>(a)) ||
                static_cast<int>(a) == vc[0];
    if (!used && vshape[a] != 1) {
      int id = p.space.make(vshape[a]);
      v_axes[a] = {id};
      p.value_dims.push_back(id);
    }
  }
  // result axes of the PV product: batch, lhs free, rhs free
  axis_indices lhs_axes = pk == 0 ? cur_axes : v_axes;
  axis_indices rhs_axes = pk == 0 ? v_axes : cur_axes;
  axis_indices out_axes;
  for (int b : lb)
    out_axes.push_back(lhs_axes[static_cast<size_t>(b)]);
  for (size_t a = 0; a < lhs_axes.size(); ++a)
    if (!contains(std::vector<int>(lb.begin(), lb.end()), static_cast<int>(a)) &&
        !contains(std::vector<int>(lc.begin(), lc.end()), static_cast<int>(a)))
      out_axes.push_back(lhs_axes[a]);
  for (size_t a = 0; a < rhs_axes.size(); ++a)
    if (!contains(std::vector<int>(rb.begin(), rb.end()), static_cast<int>(a)) &&
        !contains(std::vector<int>(rc.begin(), rc.end()), static_cast<int>(a)))
      out_axes.push_back(rhs_axes[a]);
  auto vt = trace_back(g, p.space, vref, v_axes);
  if (!vt) {
    why = "cannot trace the values operand";
    return std::nullopt;
  }
  p.v = *vt;
  p.attention_nodes.push_back(stop);
  p.pv_out_dtype = g.dtype(node_ref(stop));
  // the output: layout ops and casts (and the deferred normalisation) to the graph output
  cur = node_ref(stop);
  dtype = g.dtype(cur);
  while (true) {
    passed.clear();
    if (!f.forward(cur, out_axes, dtype, stop, passed, why))
      return std::nullopt;
    p.attention_nodes.insert(p.attention_nodes.end(), passed.begin(), passed.end());
    if (stop >= 0 && p.deferred_norm && g.primitive(stop) == "div" &&
        operand_reading(g, stop, cur) == 0) {
      std::vector<int> nodes;
      if (is_sum_broadcast(g, g.operand(stop, 1), sm.sum, false, nodes)) {
        p.attention_nodes.push_back(stop);
        p.attention_nodes.insert(p.attention_nodes.end(), nodes.begin(), nodes.end());
        cur = node_ref(stop);
        dtype = g.dtype(cur);
        p.deferred_norm = false;  // found: the division is part of the attention
        continue;
      }
    }
    break;
  }
  if (sm.deferred && p.deferred_norm) {
    why = "unnormalised probabilities without the division by their sum";
    return std::nullopt;
  }
  p.deferred_norm = sm.deferred;
  p.epilogue_from = stop;      // computed after the kernel (an output projection, a cast)
  p.out_value = cur;
  p.out_axes = out_axes;
  p.out_dtype = dtype;
  // the query-key products
  for (int dot : f.dots()) {
    attention_term t;
    t.dot = dot;
    axis_indices la, ra;
    if (!dot_operand_indices(g, p.space, dot, p.region_axes[dot], la, ra, t.contraction)) {
      why = "cannot read the query-key product's dimensions";
      return std::nullopt;
    }
    auto lt = trace_back(g, p.space, g.operand(dot, 0), la);
    auto rt = trace_back(g, p.space, g.operand(dot, 1), ra);
    if (!lt || !rt) {
      why = "cannot trace a query-key product's operands";
      return std::nullopt;
    }
    auto key_leaves = p.space.expand(p.s_axes[static_cast<size_t>(sm.axis)]);
    auto has_key = [&](const traced_operand& t2) {
      auto l = leaves_of(p.space.expand(t2.axes));
      for (int k : key_leaves)
        if (contains(l, k))
          return true;
      return false;
    };
    bool lk = has_key(*lt), rk = has_key(*rt);
    if (lk == rk) {
      why = "a product in the scores is not query x key";
      return std::nullopt;
    }
    t.q = lk ? *rt : *lt;
    t.k = lk ? *lt : *rt;
    p.attention_nodes.push_back(dot);
    p.terms.push_back(std::move(t));
  }
  // normalise every index list to leaves
  p.s_axes = p.space.expand(p.s_axes);
  p.out_axes = p.space.expand(p.out_axes);
  p.v.axes = p.space.expand(p.v.axes);
  p.value_dims = p.space.expand(p.value_dims);
  for (auto& t : p.terms) {
    t.q.axes = p.space.expand(t.q.axes);
    t.k.axes = p.space.expand(t.k.axes);
    t.contraction = p.space.expand(t.contraction);
  }
  for (auto& [id, axes] : p.region_axes)
    axes = p.space.expand(axes);
  for (auto& u : p.region_inputs)
    u.axes = p.space.expand(u.axes);
  for (auto& [read, axes] : p.iota_reads)
    axes = p.space.expand(axes);
  p.keys = p.s_axes[static_cast<size_t>(sm.axis)];
  std::set<int> kv_side;
  for (const auto& t : p.terms)
    for (int l : leaves_of(t.k.axes))
      kv_side.insert(l);
  for (int l : leaves_of(p.v.axes))
    kv_side.insert(l);
  for (size_t a = 0; a < p.s_axes.size(); ++a) {
    if (static_cast<int>(a) == sm.axis)
      continue;
    for (int l : p.s_axes[a])
      (kv_side.count(l) ? p.kv_rows : p.q_rows).push_back(l);
  }
  for (int n : p.region)
    p.attention_nodes.push_back(n);
  std::sort(p.region.begin(), p.region.end());
  std::sort(p.attention_nodes.begin(), p.attention_nodes.end());
  p.attention_nodes.erase(std::unique(p.attention_nodes.begin(), p.attention_nodes.end()),
                          p.attention_nodes.end());
  return p;
}

}  // namespace

std::optional<attention_pattern> find_attention(const graph_view& g, std::string& why) {
  if (g.output_count() != 1) {
    why = "the reference has " + std::to_string(g.output_count()) + " outputs";
    return std::nullopt;
  }
  std::optional<attention_pattern> found;
  int softmaxes = 0;
  std::string last_why = "no softmax (exp normalised by its row sum) in the reference";
  for (int e : g.find("exp")) {
    if (g.in_loop(e))
      continue;
    auto sm = match_softmax(g, e);
    if (!sm)
      continue;
    ++softmaxes;
    std::string w;
    auto p = find_with_softmax(g, *sm, w);
    if (p && !found)
      found = std::move(p);
    else if (!p)
      last_why = w;
  }
  if (softmaxes > 1) {
    why = "several softmaxes in the reference";
    return std::nullopt;
  }
  if (!found)
    why = last_why;
  return found;
}

std::string leaf_role(const attention_pattern& p, int leaf) {
  if (contains(p.keys, leaf))
    return "key";
  if (contains(p.kv_rows, leaf))
    return "kv_row";
  if (contains(p.q_rows, leaf))
    return "q_row";
  if (contains(p.value_dims, leaf))
    return "value";
  for (const auto& t : p.terms)
    if (contains(t.contraction, leaf))
      return "contraction";
  return "";
}

}  // namespace maxkernel::agents::expert
