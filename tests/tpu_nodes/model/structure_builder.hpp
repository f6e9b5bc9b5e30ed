// Builds KernelStructures and DataflowGraphs by hand for model tests, and a round-number chip
// whose rates make the expected times easy to compute on paper.
#pragma once

#include "config/chip.hpp"
#include "maxkernel/schema/kernel_structure.capnp.h"

#include <capnp/message.h>

#include <string>
#include <vector>

namespace maxkernel::tests {

// 1 device, 1 core; 1e9 B/s HBM and 1e9 VPU flop/s so that one byte or flop is 1 ns; every
// efficiency 1 and every fixed cost 0 unless a test sets it.
config::chip paper_chip();

struct dependence_spec {
  unsigned axis;
  schema::DepKind kind = schema::DepKind::AFFINE;
  double fraction = 1.0;
};

struct operand_spec {
  schema::OperandRole role = schema::OperandRole::INPUT;
  std::vector<int64_t> shape;
  std::vector<int64_t> block;
  std::string dtype = "float32";
  std::vector<dependence_spec> deps;
  std::string space = "vmem";
  unsigned buffering = 2;
};

struct dot_spec {
  int64_t m, n, k;
  std::string dtype = "bfloat16";
  int64_t batch = 1;
};

struct call_spec {
  std::string name = "kernel";
  std::vector<int64_t> grid;
  std::vector<std::string> semantics;
  std::vector<operand_spec> operands;
  std::vector<dot_spec> dots;
  double vpu_flops = 0;
  double transcendentals = 0;
  double dma_bytes = 0;
  int64_t vmem_limit = 0;
  std::vector<std::pair<std::vector<int64_t>, std::string>> scratch;
};

struct node_spec {
  std::string primitive;
  std::vector<int> operand_ids;            // -1: a graph input
  std::vector<std::vector<int64_t>> operand_shapes;
  std::vector<int64_t> result_shape;
  std::string dtype = "float32";
  double flops = 0;
  double transcendentals = 0;
  bool dot = false;                        // fills DotOp from the first two operands (m,k)x(k,n)
};

void build_call(schema::PallasCall::Builder call, const call_spec& spec);
void build_graph(schema::DataflowGraph::Builder graph, const std::vector<node_spec>& nodes,
                 double min_bytes = 0);

}  // namespace maxkernel::tests
