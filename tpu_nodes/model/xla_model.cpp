#include "tpu_nodes/model/xla_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace maxkernel::tpu_nodes::model {

namespace {

enum class op_kind {
  free,         // metadata or fused into every consumer: reshape, broadcast, iota
  elementwise,  // fusible loop work, data movement included
  matmul,       // dot_general, convolution: the MXU
  reduce,       // reductions and scans
  in_place,     // dynamic_update_slice, scatter: write the update into the operand
  gather,       // reads only the rows it gathers
  opaque,       // its own kernel, priced by its bytes and flops (sort, top_k, fft, ...)
  pallas,       // a pallas_call: priced by the pipeline model, a boundary here
};

const std::unordered_set<std::string_view>& free_ops() {
  static const std::unordered_set<std::string_view> s{
      "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "iota", "copy", "copy_p",
      "stop_gradient", "bitcast_convert_type", "optimization_barrier", "device_put",
      "sharding_constraint", "mesh_cast", "reduce_precision"};
  return s;
}

const std::unordered_set<std::string_view>& elementwise_ops() {
  static const std::unordered_set<std::string_view> s{
      "add", "add_any", "sub", "mul", "div", "rem", "max", "min", "neg", "sign", "floor",
      "ceil", "round", "abs", "and", "or", "xor", "not", "eq", "ne", "lt", "le", "gt", "ge",
      "eq_to", "lt_to", "le_to",
      "select_n", "clamp", "nextafter", "shift_left", "shift_right_logical",
      "shift_right_arithmetic", "population_count", "clz", "square", "is_finite", "conj",
      "real", "imag", "complex", "copysign", "convert_element_type", "integer_pow", "exp",
      "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "erfc", "erf_inv", "rsqrt",
      "sqrt", "cbrt", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
      "asinh", "acosh", "atanh", "pow", "lgamma", "digamma", "transpose", "slice",
      "dynamic_slice", "concatenate", "pad", "rev", "split", "select_and_gather_add",
      "random_bits", "random_seed", "random_wrap", "random_unwrap", "threefry2x32",
      "erf_inv_approx", "imul", "max_p", "min_p"};
  return s;
}

const std::unordered_set<std::string_view>& reduce_ops() {
  static const std::unordered_set<std::string_view> s{
      "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
      "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
      "cumlogsumexp", "reduce_window_sum", "reduce_window_max", "reduce_window_min",
      "reduce_window", "reduce"};
  return s;
}

const std::unordered_set<std::string_view>& opaque_ops() {
  static const std::unordered_set<std::string_view> s{
      "sort", "top_k", "fft", "custom_call", "triangular_solve", "cholesky", "lu", "qr",
      "eigh", "svd", "rng_bit_generator", "while", "cond", "scan", "approx_top_k",
      "select_and_scatter_add", "ragged_dot", "ragged_dot_general"};
  return s;
}

op_kind kind_of(std::string_view p, bool& known) {
  known = true;
  if (p == "pallas_call")
    return op_kind::pallas;
  if (p == "dot_general" || p == "conv_general_dilated")
    return op_kind::matmul;
  if (p == "dynamic_update_slice" || p.starts_with("scatter"))
    return op_kind::in_place;
  if (p == "gather")
    return op_kind::gather;
  if (free_ops().contains(p))
    return op_kind::free;
  if (reduce_ops().contains(p))
    return op_kind::reduce;
  if (elementwise_ops().contains(p))
    return op_kind::elementwise;
  if (opaque_ops().contains(p))
    return op_kind::opaque;
  known = false;
  return op_kind::elementwise;
}

double tensor_bytes(schema::TensorType::Reader t) {
  double n = itemsize_of(t.getDtype().cStr());
  for (auto d : t.getShape())
    n *= static_cast<double>(std::max<int64_t>(d, 0));
  return n;
}

}  // namespace

xla_estimate price_xla_graph(schema::DataflowGraph::Reader graph, const device_rates& rates) {
  const auto& eff = rates.chip->efficiency;
  auto nodes = graph.getNodes();
  int n = static_cast<int>(nodes.size());
  xla_estimate est;
  std::vector<op_kind> kind(n);
  std::set<std::string> unknown;
  for (int i = 0; i < n; ++i) {
    bool known = true;
    kind[i] = kind_of(nodes[i].getPrimitive().cStr(), known);
    if (!known)
      unknown.insert(nodes[i].getPrimitive().cStr());
  }
  auto valid = [&](int id) { return id >= 0 && id < n; };
  // The producer a node really reads: free ops are looked through (fused into consumers).
  std::vector<int> source(n);
  std::vector<double> source_bytes(n, 0);  // bytes of that producer's result
  for (int i = 0; i < n; ++i) {
    auto node = nodes[i];
    source[i] = i;
    for (auto r : node.getResults())
      source_bytes[i] += tensor_bytes(r);
    if (kind[i] == op_kind::free) {
      auto ids = node.getOperandIds();
      int p = ids.size() > 0 ? ids[0] : -1;
      // Broadcasts read their (smaller) source; a free op of a graph input reads that input.
      if (valid(p) && p < i) {
        source[i] = source[p];
        source_bytes[i] = source_bytes[p];
      } else {
        source[i] = -1;
        source_bytes[i] = node.getOperands().size() > 0 ? tensor_bytes(node.getOperands()[0]) : 0;
      }
    }
  }
  auto producer = [&](int id) { return valid(id) ? source[id] : -1; };

  // Consumers on the graph with free ops looked through.
  std::vector<std::vector<int>> consumers(n);
  for (int i = 0; i < n; ++i) {
    if (kind[i] == op_kind::free)
      continue;
    for (auto id : nodes[i].getOperandIds()) {
      int p = producer(id);
      if (p >= 0 && std::find(consumers[p].begin(), consumers[p].end(), i) == consumers[p].end())
        consumers[p].push_back(i);
    }
  }
  auto same_count = [&](int a, int b) { return nodes[a].getCount() == nodes[b].getCount(); };

  // What lands in HBM: every non-elementwise result, every graph output, and a value that
  // crosses a loop boundary. Elementwise work between them is recomputed inside each fusion
  // that reads it, as XLA duplicates cheap producers into their consumers.
  std::vector<bool> materialized(n, false);
  for (int i = 0; i < n; ++i) {
    if (kind[i] == op_kind::free)
      continue;
    materialized[i] = kind[i] != op_kind::elementwise || consumers[i].empty();
    // A custom call (a pallas_call, sort, ...) reads its operands from HBM.
    for (int c : consumers[i])
      materialized[i] = materialized[i] || !same_count(i, c) || kind[c] == op_kind::pallas
                        || kind[c] == op_kind::opaque;
  }
  // Output fusion: a dot whose one consumer is elementwise, and whose value reaches exactly
  // one materialized result through elementwise ops, is computed inside that result's fusion.
  for (int d = 0; d < n; ++d) {
    if (kind[d] != op_kind::matmul || consumers[d].size() != 1
        || kind[consumers[d][0]] != op_kind::elementwise)
      continue;
    std::set<int> roots, seen;
    std::vector<int> stack{consumers[d][0]};
    while (!stack.empty()) {
      int x = stack.back();
      stack.pop_back();
      if (!seen.insert(x).second)
        continue;
      if (materialized[x]) {
        roots.insert(x);
        continue;
      }
      for (int c : consumers[x])
        stack.push_back(c);
    }
    if (roots.size() == 1 && kind[*roots.begin()] == op_kind::elementwise
        && same_count(d, *roots.begin()))
      materialized[d] = false;
  }

  // One fusion per materialized result: the result's op and everything unmaterialized behind
  // it, reading the materialized values (and graph inputs) at its frontier.
  double matmul_device = rates.bf16_core * rates.cores;
  double vpu_device = rates.vpu_core * rates.cores * eff.vpu;
  double eup_device = rates.eup_core * rates.cores * eff.vpu;
  double bw = rates.hbm * eff.xla_hbm * 1e-6;
  double compute_bound_us = 0;
  std::vector<int> mark(n, -1);
  for (int root = 0; root < n; ++root) {
    if (!materialized[root] || kind[root] == op_kind::pallas)
      continue;
    std::set<int> read;
    double bytes = 0, mxu_us = 0, vpu_flops = 0, eup = 0, flops = 0;
    std::vector<int> stack{root};
    while (!stack.empty()) {
      int m = stack.back();
      stack.pop_back();
      if (mark[m] == root)
        continue;
      mark[m] = root;
      auto node = nodes[m];
      auto ids = node.getOperandIds();
      auto ops = node.getOperands();
      double result_bytes = 0;
      for (auto r : node.getResults())
        result_bytes += tensor_bytes(r);
      for (unsigned j = 0; j < ops.size(); ++j) {
        int id = j < ids.size() ? ids[j] : -1;
        int p = producer(id);
        if (p >= 0 && !materialized[p]) {
          stack.push_back(p);  // recomputed here
          continue;
        }
        if (p >= 0 && !read.insert(p).second)
          continue;  // already read by this fusion
        double b = valid(id) ? source_bytes[id] : tensor_bytes(ops[j]);
        if (j == 0 && kind[m] == op_kind::in_place)
          b = 0;  // updated in place
        else if (j == 0 && (kind[m] == op_kind::gather || node.getPrimitive() == "slice"
                            || node.getPrimitive() == "dynamic_slice"))
          b = std::min(b, result_bytes);
        bytes += b;
      }
      if (m == root) {
        if (kind[m] == op_kind::in_place && ops.size() > 1)
          bytes += tensor_bytes(ops[ops.size() - 1]);  // only the update is written
        else
          bytes += result_bytes;
      }
      if (node.getHasDot()) {
        mxu_us += rates.matmul_us(node.getDot(), eff.xla_mxu, rates.cores);
        est.matmul_flops += node.getFlops() * node.getCount();
      } else if (kind[m] == op_kind::matmul) {
        mxu_us += node.getFlops() / (matmul_device * eff.xla_mxu) * 1e6;
        est.matmul_flops += node.getFlops() * node.getCount();
      } else {
        vpu_flops += node.getFlops();
      }
      eup += node.getTranscendentals();
      flops += node.getFlops();
    }
    double count = nodes[root].getCount();
    double compute = rates.overlapped(mxu_us, vpu_flops / vpu_device * 1e6, eup / eup_device * 1e6);
    double memory = bytes / bw;
    est.time_us += (std::max(compute, memory) + eff.xla_fusion_us) * count;
    est.compute_us += compute * count;
    est.memory_us += memory * count;
    est.overhead_us += eff.xla_fusion_us * count;
    if (compute >= memory)
      compute_bound_us += compute * count;
    est.flops += flops * count;
    est.hbm_bytes += bytes * count;
    est.fusions += 1;
  }
  for (const auto& p : unknown)
    est.unmodeled.push_back(fmt::format("primitive {} is unknown to the model: priced as an "
                                        "elementwise fusion by its bytes and flops", p));
  if (est.overhead_us > est.time_us * 0.5)
    est.bound = "overhead";
  else if (compute_bound_us > 0.5 * (est.time_us - est.overhead_us))
    est.bound = "compute";
  else
    est.bound = "memory";
  return est;
}

}  // namespace maxkernel::tpu_nodes::model
