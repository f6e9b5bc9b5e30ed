#include "structure_builder.hpp"

#include <numeric>

namespace maxkernel::tests {

config::chip paper_chip() {
  config::chip c;
  c.name = "paper";
  c.devices_per_chip = 1;
  c.cores_per_device = 1;
  c.megacore = false;
  c.mxus_per_core = 1;
  c.mxu_size = 128;
  c.clock_hz = 1e9;
  c.bf16_flops = 1e12;
  c.int8_ops = 2e12;
  c.fp8_flops = 0;
  c.vpu_flops = 1e9;
  c.transcendentals = 1e8;
  c.hbm_bytes = 16ull << 30;
  c.hbm_bandwidth = 1e9;
  c.vmem_bytes = 128ull << 20;
  c.scoped_vmem_bytes = 16ull << 20;
  c.smem_bytes = 1 << 20;
  c.efficiency = {.mxu = 1, .vpu = 1, .hbm = 1, .dma_latency_us = 0, .step_overhead_us = 0,
                  .kernel_launch_us = 0, .xla_mxu = 1, .xla_hbm = 1, .xla_fusion_us = 0,
                  .f32_matmul_passes = 3, .slot_overlap = 1};
  return c;
}

namespace {

template <class List>
void set_ints(List list, const std::vector<int64_t>& v) {
  for (unsigned i = 0; i < v.size(); ++i)
    list.set(i, v[i]);
}

int64_t elements(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1},
                         [](int64_t a, int64_t b) { return a * (b < 0 ? 1 : b); });
}

}  // namespace

void build_call(schema::PallasCall::Builder call, const call_spec& spec) {
  call.setName(spec.name);
  set_ints(call.initGrid(static_cast<unsigned>(spec.grid.size())), spec.grid);
  auto sem = call.initDimensionSemantics(static_cast<unsigned>(spec.semantics.size()));
  for (unsigned i = 0; i < spec.semantics.size(); ++i)
    sem.set(i, spec.semantics[i]);
  auto ops = call.initOperands(static_cast<unsigned>(spec.operands.size()));
  unsigned inputs = 0, outputs = 0;
  for (unsigned i = 0; i < spec.operands.size(); ++i) {
    const auto& o = spec.operands[i];
    auto op = ops[i];
    op.setRole(o.role);
    op.setIndex(o.role == schema::OperandRole::OUTPUT ? outputs++ : inputs++);
    set_ints(op.getType().initShape(static_cast<unsigned>(o.shape.size())), o.shape);
    op.getType().setDtype(o.dtype);
    set_ints(op.initBlockShape(static_cast<unsigned>(o.block.size())), o.block);
    op.setMemorySpace(o.space);
    op.setBuffering(o.buffering);
    auto deps = op.initDependence(static_cast<unsigned>(spec.grid.size()));
    for (unsigned a = 0; a < spec.grid.size(); ++a) {
      deps[a].setAxis(a);
      deps[a].setKind(schema::DepKind::NONE);
      for (const auto& d : o.deps)
        if (d.axis == a) {
          deps[a].setKind(d.kind);
          deps[a].setChangeFraction(d.fraction);
        }
    }
    op.setBlockBytes(elements(o.block) * (o.dtype == "float32" ? 4 : 2));
  }
  auto dots = call.initStepDots(static_cast<unsigned>(spec.dots.size()));
  double flops = spec.vpu_flops;
  for (unsigned i = 0; i < spec.dots.size(); ++i) {
    const auto& d = spec.dots[i];
    dots[i].setBatch(d.batch);
    dots[i].setM(d.m);
    dots[i].setN(d.n);
    dots[i].setK(d.k);
    dots[i].setLhsDtype(d.dtype);
    dots[i].setRhsDtype(d.dtype);
    dots[i].setOutDtype("float32");
    dots[i].setCount(1);
    flops += 2.0 * d.batch * d.m * d.n * d.k;
  }
  call.setStepFlops(flops);
  call.setStepVpuFlops(spec.vpu_flops);
  call.setStepTranscendentals(spec.transcendentals);
  call.setStepDmaBytes(spec.dma_bytes);
  call.setVmemLimitBytes(spec.vmem_limit);
  call.setCount(1);
  auto scratch = call.initScratch(static_cast<unsigned>(spec.scratch.size()));
  for (unsigned i = 0; i < spec.scratch.size(); ++i) {
    set_ints(scratch[i].getType().initShape(static_cast<unsigned>(spec.scratch[i].first.size())),
             spec.scratch[i].first);
    scratch[i].getType().setDtype(spec.scratch[i].second);
    scratch[i].setMemorySpace("vmem");
  }
}

void build_graph(schema::DataflowGraph::Builder graph, const std::vector<node_spec>& nodes,
                 double min_bytes) {
  auto list = graph.initNodes(static_cast<unsigned>(nodes.size()));
  double flops = 0;
  for (unsigned i = 0; i < nodes.size(); ++i) {
    const auto& s = nodes[i];
    auto n = list[i];
    n.setId(static_cast<int32_t>(i));
    n.setPrimitive(s.primitive);
    auto ids = n.initOperandIds(static_cast<unsigned>(s.operand_ids.size()));
    for (unsigned j = 0; j < s.operand_ids.size(); ++j)
      ids.set(j, s.operand_ids[j]);
    auto ops = n.initOperands(static_cast<unsigned>(s.operand_shapes.size()));
    for (unsigned j = 0; j < s.operand_shapes.size(); ++j) {
      set_ints(ops[j].initShape(static_cast<unsigned>(s.operand_shapes[j].size())),
               s.operand_shapes[j]);
      ops[j].setDtype(s.dtype);
    }
    auto res = n.initResults(1);
    set_ints(res[0].initShape(static_cast<unsigned>(s.result_shape.size())), s.result_shape);
    res[0].setDtype(s.dtype);
    n.setFlops(s.flops);
    n.setTranscendentals(s.transcendentals);
    n.setCount(1);
    if (s.dot) {
      auto d = n.initDot();
      d.setBatch(1);
      d.setM(s.operand_shapes[0][0]);
      d.setK(s.operand_shapes[0][1]);
      d.setN(s.operand_shapes[1][1]);
      d.setLhsDtype(s.dtype);
      d.setRhsDtype(s.dtype);
      d.setOutDtype(s.dtype);
      n.setHasDot(true);
    }
    flops += s.flops;
  }
  graph.setFlops(flops);
  graph.setMinBytes(min_bytes);
}

}  // namespace maxkernel::tests
