#include "agents/expert/fused_epilogue.hpp"

#include "agents/expert/moe_patterns.hpp"
#include "agents/expert/replay_program.hpp"

#include <fmt/format.h>

namespace maxkernel::agents::expert::moe {

namespace {

value_ref node_ref(int id) { return value_ref{value_ref::kind::node, id, ""}; }

// accs[i], rounded to the seed's float dtype when it is narrower than f32.
std::string seed_list(const graph_view& g, const std::vector<block_seed>& seeds) {
  std::string s = "[";
  for (size_t i = 0; i < seeds.size(); ++i) {
    auto d = g.dtype(seeds[i].value);
    if (d.find("float") != std::string::npos && dtype_bytes(d) < 4)
      s += fmt::format("accs[{}].astype({}).astype(jnp.float32), ", i, py_dtype(d));
    else
      s += fmt::format("accs[{}], ", i);
  }
  return s + "]";
}

}  // namespace

std::vector<int> chain_ends(const graph_view& g, int start) {
  std::set<int> outputs;
  for (unsigned k = 0; k < g.output_count(); ++k)
    if (g.output(k).is_node())
      outputs.insert(g.output(k).id);
  auto shape = g.shape(node_ref(start));
  std::vector<int> chain{start};
  int cur = start;
  while (!outputs.count(cur) && g.consumers(cur).size() == 1) {
    int c = g.consumers(cur)[0];
    if (g.node(c).getResults().size() != 1 || g.shape(node_ref(c)) != shape || g.in_loop(c))
      break;
    chain.push_back(c);
    cur = c;
  }
  return {chain.rbegin(), chain.rend()};
}

fused_epilogue build_fused_epilogue(const graph_view& g, const dim_symbols& dims,
                                    const epilogue_request& req, std::string& notes) {
  fused_epilogue out;
  auto seeds = seed_list(g, req.seeds);
  for (int end : req.ends) {
    bool is_seed = false;
    for (size_t i = 0; i < req.seeds.size(); ++i)
      if (req.seeds[i].value.is_node() && req.seeds[i].value.id == end) {
        is_seed = true;
        out.end = end;
        out.dtype = g.dtype(node_ref(end));
        out.how = "none";
        out.code = fmt::format("def {}(accs, extras, offsets, extents):\n    return accs[{}]\n",
                               req.name, i);
      }
    if (is_seed)
      return out;
    auto try_block_program = [&]() {
      block_request br;
      br.space = req.space;
      br.seeds = req.seeds;
      br.outputs = {node_ref(end)};
      br.name = req.name + "_block";
      block_program bp;
      std::string why;
      if (!build_block_program(g, br, bp, why)) {
        notes += fmt::format("block_program to node {}: {}; ", end, why);
        return false;
      }
      out.end = end;
      out.dtype = g.dtype(node_ref(end));
      out.how = "block_program";
      out.extras = bp.operands;
      out.primitives.insert(bp.primitives.begin(), bp.primitives.end());
      // block_program rounds narrow-float seeds itself
      out.code = bp.code + fmt::format(
          "\n\ndef {}(accs, extras, offsets, extents):\n    return {}(accs, extras, offsets, "
          "extents)[0]\n", req.name, br.name);
      return true;
    };
    auto try_replay = [&]() {
      replay_request rr;
      rr.block_mode = true;
      for (size_t i = 0; i < req.seeds.size(); ++i)
        if (req.seeds[i].value.is_node())
          rr.given[req.seeds[i].value.id] = fmt::format("seeds[{}]", i);
      rr.outputs = {node_ref(end)};
      rr.prefix = "e";
      replay_code rc;
      std::string why;
      if (!build_replay(g, dims, rr, rc, why)) {
        notes += fmt::format("replay to node {}: {}; ", end, why);
        return false;
      }
      out.end = end;
      out.dtype = g.dtype(node_ref(end));
      out.how = "replay";
      out.primitives = rc.primitives;
      out.code = py_function(req.name + "_chain", {"seeds"}, rc, rc.outputs[0]) + fmt::format(
          "\n\ndef {}(accs, extras, offsets, extents):\n    return {}_chain({})\n", req.name,
          req.name, seeds);
      return true;
    };
    // Elementwise chains computed in a narrow float go to the replay, which rounds as the
    // reference does; everything else (f32 chains, bias operands, reductions) to block_program.
    bool narrow_ops = false;
    {
      std::vector<int> stack{end};
      std::set<int> seen;
      while (!stack.empty()) {
        int n = stack.back();
        stack.pop_back();
        if (!seen.insert(n).second)
          continue;
        bool is_seed_node = false;
        for (const auto& sd : req.seeds)
          is_seed_node = is_seed_node || (sd.value.is_node() && sd.value.id == n);
        if (is_seed_node)
          continue;
        auto d = g.dtype(node_ref(n));
        narrow_ops = narrow_ops || (d.find("float") != std::string::npos && dtype_bytes(d) < 4 &&
                                    g.primitive(n) != "convert_element_type");
        for (unsigned k = 0; k < g.operand_count(n); ++k)
          if (g.operand(n, k).is_node())
            stack.push_back(g.operand(n, k).id);
      }
    }
    if (narrow_ops ? (try_replay() || try_block_program()) : (try_block_program() || try_replay()))
      return out;
  }
  return out;  // end -1: nothing fits
}

}  // namespace maxkernel::agents::expert::moe
