# What a traced kernel does: its pallas_calls (grid, blocks, per-step work) and the work
# outside them, as a dataflow graph. Input of the TPU performance model.
@0xe7a83b2baa153a69;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");
using import "common.capnp".TensorType;

# One dot_general, reduced to the sizes the MXU sees: lhs (batch, m, k) x rhs (batch, k, n).
struct DotOp {
  batch @0 :Int64;            # product of the batch dims
  m @1 :Int64;                # product of lhs free dims
  n @2 :Int64;                # product of rhs free dims
  k @3 :Int64;                # product of contracting dims
  lhsDtype @4 :Text;          # numpy dtype names: bfloat16, float32, int8, float8_e4m3fn ...
  rhsDtype @5 :Text;
  outDtype @6 :Text;
  count @7 :Float64 = 1;      # times executed per grid step (or per graph run)
}

# One jaxpr equation.
struct DataflowNode {
  id @0 :Int32;
  primitive @1 :Text;
  params @2 :Text;            # JSON object of the parameters that matter
  operands @3 :List(TensorType);
  results @4 :List(TensorType);
  operandIds @5 :List(Int32); # producing node ids; -1 for a graph input or constant
  flops @6 :Float64;
  transcendentals @7 :Float64;
  bytes @8 :Float64;          # operand + result bytes
  count @9 :Float64 = 1;      # times executed (loop bodies)
  dot @10 :DotOp;             # set for dot_general (hasDot)
  hasDot @11 :Bool;
  operandInputs @12 :List(Int32);  # per operand: the graph input it is, or -1
  operandLiterals @13 :List(Text); # per operand: JSON of a scalar literal or constant, or ""
  operandResults @14 :List(Int32); # per operand: which result of its producer (operandIds) it
                                   # reads, -1 when not a node's result; empty in older summaries
}

struct DataflowGraph {
  nodes @0 :List(DataflowNode);
  inputs @1 :List(TensorType);
  outputs @2 :List(TensorType);
  flops @3 :Float64;
  transcendentals @4 :Float64;
  bytes @5 :Float64;          # sum over nodes: an upper bound on HBM traffic without fusion
  minBytes @6 :Float64;       # graph inputs + outputs only: the traffic of a perfect fusion
  outputIds @7 :List(Int32);  # per output: the node producing it, -1 for an input passed through
  outputInputs @8 :List(Int32); # per output: the graph input it is when passed through, or -1
  outputResults @9 :List(Int32); # per output: which result of its node
}

enum OperandRole { input @0; output @1; scalarPrefetch @2; }

enum DepKind {
  none @0;        # the block index does not change along this axis
  affine @1;      # changes by fixed deltas per step
  irregular @2;   # data-dependent or non-affine (scalar prefetch tables)
}

# How an operand's block index moves when one grid axis advances by one step.
struct AxisDependence {
  axis @0 :UInt32;
  kind @1 :DepKind;
  deltas @2 :List(Int64);     # per block dimension, for affine
  changeFraction @3 :Float64; # share of steps along the axis whose block index changes
}

struct Operand {
  role @0 :OperandRole;
  index @1 :UInt32;
  type @2 :TensorType;        # the whole array
  blockShape @3 :List(Int64); # -1 marks a squeezed (None) dimension
  memorySpace @4 :Text;       # vmem, smem, any, hbm, semaphore
  buffering @5 :UInt32;       # buffer count; 2 is Pallas's default
  dependence @6 :List(AxisDependence);
  blockBytes @7 :Int64;
}

struct Scratch {
  type @0 :TensorType;
  memorySpace @1 :Text;
  bytes @2 :Int64;
}

struct PallasCall {
  name @0 :Text;
  grid @1 :List(Int64);
  dimensionSemantics @2 :List(Text);
  operands @3 :List(Operand);
  scratch @4 :List(Scratch);
  numScalarPrefetch @5 :UInt32;
  vmemLimitBytes @6 :Int64;   # 0 when the compiler default applies
  stepFlops @7 :Float64;      # per grid step, from the kernel body's jaxpr
  stepTranscendentals @8 :Float64;
  stepBytes @9 :Float64;      # bytes the body reads and writes from VMEM per step
  costFlops @10 :Float64;     # the kernel's own pl.CostEstimate, 0 when absent
  costTranscendentals @11 :Float64;
  costBytes @12 :Float64;
  count @13 :Float64 = 1;     # times called (inside scans / loops)
  bodyPrimitives @14 :List(Text);
  inputOutputAliases @15 :List(Int64);   # pairs: input index, output index
  stepDots @16 :List(DotOp);  # the body's matmuls per grid step
  stepVpuFlops @17 :Float64;  # the body's non-matmul flops per step (elementwise, reductions)
  stepDmaBytes @18 :Float64;  # bytes the body copies by hand per step (make_async_copy)
  unknownPrimitives @19 :List(Text);  # body primitives the extractor could not cost
}

struct KernelStructure {
  schemaVersion @0 :UInt32;
  pallasCalls @1 :List(PallasCall);
  outside @2 :DataflowGraph;  # work done outside the pallas_calls
}
