# The messages of the sub-agent pool (agents/, docs/agents.md). The profiler: a Profile
# (modeled or measured), the candidate's KernelStructure and the chip -> a Diagnosis. The
# planner: spec, analyze summary and history -> a Plan. The implementer: a plan step and its
# parent -> a Candidate. The debugger: a failed candidate -> a repaired one or a reason. The
# tester: a spec -> the test cases to run, and the results -> a verdict.
@0xcab98e6bb553fcdd;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");
using import "profile.capnp".Timing;
using import "profile.capnp".Profile;
using import "kernel_structure.capnp".KernelStructure;
using import "kernel_structure.capnp".DataflowGraph;
using import "kernel_spec.capnp".KernelSpec;
using import "candidate.capnp".Candidate;
using import "candidate.capnp".Param;
using import "eval.capnp".EvalResult;
using import "eval.capnp".EvalOptions;

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

# Tokens and money an LLM brain spent (zero for the expert brain).
struct Usage {
  promptTokens @0 :UInt64;
  completionTokens @1 :UInt64;
  calls @2 :UInt32;           # chat-completion requests sent (retries included)
  costUsd @3 :Float64;        # 0 when hasCost is false
  hasCost @4 :Bool;           # the brain's config gives prices
}

# One strategy: a first candidate from a template, or a move applied to a parent.
struct PlanStep {
  move @0 :Text;              # "template" (a first candidate) or a playbook move (docs/agents.md)
  template @1 :Text;          # the template family the candidate is (to be) rendered from
  parentId @2 :Text;          # the candidate the move applies to; "" for a first candidate
  changes @3 :List(Param);    # parameter -> new value (JSON literal); the whole set for "template"
  rationale @4 :Text;         # why, with the numbers (bound, % of roofline, VMEM used of budget)
  expectedEffect @5 :Text;    # what should change ("memory time -40%", "fits VMEM: 24 of 32 MiB")
  score @6 :Float64;          # the planner's ranking; higher first
  brain @7 :Text;             # expert | llm
  instructions @8 :Text;      # free text for an LLM implementer ("" for the expert brain)
  signature @9 :Text;         # the kind of change, alike from any parent ("matmul:block_m+");
                              # "" when the brain does not say
}

struct Plan {
  schemaVersion @0 :UInt32;
  steps @1 :List(PlanStep);   # best first
  noTemplate @2 :Bool;        # the expert brain found no template for the reference
  message @3 :Text;           # why there are no steps, or what was recognised
  usage @4 :Usage;
}

# A candidate already evaluated, with what was learned from it.
struct HistoryEntry {
  candidate @0 :Candidate;
  result @1 :EvalResult;
  diagnosis @2 :Diagnosis;
  hasDiagnosis @3 :Bool;
}

struct PlannerRequest {
  schemaVersion @0 :UInt32;
  spec @1 :KernelSpec;
  analysis @2 :DataflowGraph;     # the reference's analyze summary (configuration 0)
  history @3 :List(HistoryEntry); # oldest first
  chip @4 :Text;
  maxSteps @5 :UInt32;            # 0: the brain's default; the graph search asks for several
  seed @6 :UInt64;
  parentId @7 :Text;              # expand this candidate of the history (the graph search's
                                  # frontier vertex); "" = the best correct one
  guidance @8 :List(Text);        # hitl: the operator's feedback and hints, oldest first
}

struct ImplementRequest {
  schemaVersion @0 :UInt32;
  spec @1 :KernelSpec;
  analysis @2 :DataflowGraph;
  step @3 :PlanStep;
  parent @4 :Candidate;           # when hasParent
  hasParent @5 :Bool;
  chip @6 :Text;
}

struct ImplementReply {
  schemaVersion @0 :UInt32;
  candidate @1 :Candidate;
  usage @2 :Usage;
}

struct DebugRequest {
  schemaVersion @0 :UInt32;
  spec @1 :KernelSpec;
  analysis @2 :DataflowGraph;
  candidate @3 :Candidate;
  result @4 :EvalResult;          # its failed evaluation
  attempt @5 :UInt32;             # 1 for the first repair of this lineage
  maxAttempts @6 :UInt32;
  chip @7 :Text;
  tried @8 :List(Text);           # fixes already tried on this lineage (the replies' `fix`)
}

struct DebugReply {
  schemaVersion @0 :UInt32;
  repaired @1 :Bool;              # false: the debugger gives up (reason says why)
  candidate @2 :Candidate;        # when repaired
  fix @3 :Text;                   # the rule applied ("vmemOom: shrink bk 2048 -> 1024")
  reason @4 :Text;                # what was wrong, or why it gives up
  usage @5 :Usage;
}

# The tester: which evaluations make a candidate "correct" for this spec.
struct TesterRequest {
  schemaVersion @0 :UInt32;
  spec @1 :KernelSpec;
  analysis @2 :DataflowGraph;
  chip @3 :Text;
  seed @4 :UInt64;
  thorough @5 :Bool;              # a final check (full shapes when they fit, more cases)
}

struct TestPlanCase {
  name @0 :Text;                  # what it checks: "fresh inputs", "large magnitudes", ...
  options @1 :EvalOptions;        # seeds, full or reduced, configuration, value mode
  why @2 :Text;
}

struct TestPlan {
  schemaVersion @0 :UInt32;
  cases @1 :List(TestPlanCase);   # all must pass
}

struct JudgeRequest {
  schemaVersion @0 :UInt32;
  spec @1 :KernelSpec;
  plan @2 :TestPlan;
  results @3 :List(EvalResult);   # results[i] answers plan.cases[i]
}

struct Verdict {
  schemaVersion @0 :UInt32;
  correct @1 :Bool;
  failedCase @2 :Int32 = -1;      # the first case that failed
  summary @3 :Text;               # one line: cases passed, worst error against tolerance
  worstRatio @4 :Float64;         # max over cases of error / allowed error (< 1 passes)
}
