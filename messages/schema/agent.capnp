# The messages of the sub-agent pool (agents/). The profiler: a Profile (modeled or
# measured), the candidate's KernelStructure and the chip -> a Diagnosis (docs/agents.md).
@0xcab98e6bb553fcdd;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");
using import "profile.capnp".Timing;
using import "profile.capnp".Profile;
using import "kernel_structure.capnp".KernelStructure;

struct ProfilerRequest {
  schemaVersion @0 :UInt32;
  profile @1 :Profile;
  structure @2 :KernelStructure;  # the candidate's, when hasStructure
  hasStructure @3 :Bool;
  chip @4 :Text;                  # a chip file's name (config/chips/<chip>.yaml)
}

# What to change. The strategy playbook turns each kind into a transformation.
enum SuggestionKind {
  none @0;               # nothing worth changing (the rationale says why)
  growBlock @1;          # grow the blocks along `axis` by `factor`
  shrinkBlock @2;        # shrink the operand's block by `factor`
  reorderGrid @3;        # move grid `axis` innermost
  parallelSemantics @4;  # mark grid `axis` "parallel" (megacore chip with an idle core)
  raiseVmemLimit @5;     # raise vmem_limit_bytes by `factor` (up to the core's VMEM)
  alignToMxu @6;         # make the block dims multiples of the MXU edge
  fuseOutsideWork @7;    # move the work outside the pallas_calls into them
  reduceSteps @8;        # fewer, larger grid steps along `axis` (overhead-bound)
}

# An operand of a pallas_call as the Profile's OperandTraffic names it.
struct OperandRef {
  role @0 :Text;          # input, output, scalarPrefetch; "" when none
  index @1 :Int32 = -1;   # within its role; -1 when none
}

struct Suggestion {
  kind @0 :SuggestionKind;
  callIndex @1 :Int32 = -1;     # into Profile.calls / KernelStructure.pallasCalls
  operandRole @2 :Text;         # the operand it is about: input, output, ...; "" when none
  operandIndex @3 :Int32 = -1;  # its index within its role; -1 when none
  axis @4 :Int32 = -1;          # grid axis; -1 when none
  factor @5 :Float64;           # growth/shrink/raise factor; 0 when it does not apply
  rationale @6 :Text;           # one sentence with the numbers behind it
}

struct Diagnosis {
  schemaVersion @0 :UInt32;
  timing @1 :Timing;            # the Profile's: modeled or measured, never mixed
  chip @2 :Text;
  bound @3 :Text;               # compute, memory, overhead, latency (the Profile's)
  bottleneckCall @4 :Int32 = -1;      # the call with the most time; -1 when none
  bottleneckCallName @5 :Text;
  bottleneckOperand @6 :OperandRef;   # most HBM traffic of a memory-bound bottleneck call
  timeUs @7 :Float64;
  rooflineUs @8 :Float64;
  headroom @9 :Float64;         # rooflineUs / timeUs (1: at roofline)
  headroomUs @10 :Float64;      # timeUs - rooflineUs
  suggestions @11 :List(Suggestion);  # most promising first
}
