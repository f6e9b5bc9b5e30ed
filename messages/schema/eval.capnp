# Evaluation of one candidate against one spec: the request, the phases it passes through
# (load, lower, test, profile), each with a classified outcome, and the result.
@0xe2f604c6f461d0e3;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");
using import "kernel_spec.capnp".KernelSpec;
using import "candidate.capnp".Candidate;
using import "kernel_structure.capnp".KernelStructure;
using import "profile.capnp".Profile;

enum Phase { load @0; lower @1; test @2; profile @3; }

enum Status { ok @0; failed @1; skipped @2; }

# Why a phase failed. Classified so that the debugger and the statistics can act on it.
enum ErrorClass {
  none @0;
  loadError @1;          # the module raised on import (syntax, import, name errors)
  noWorkload @2;         # the module does not define a callable workload
  traceError @3;         # workload fails on abstract inputs (shapes, dtypes, Python errors)
  lowerBlockShape @4;    # Mosaic's (8,128) block rule or other block-shape rules
  lowerUnsupported @5;   # a primitive or layout without a TPU lowering
  lowerVerification @6;  # MLIR verification failed
  lowerError @7;         # any other lowering failure
  wrongOutput @8;        # output count, shape or dtype differs from the reference's
  mismatch @9;           # values beyond tolerance
  nonFinite @10;         # NaN or Inf where the reference is finite
  runtimeError @11;      # an exception while running in interpret mode
  rewardHack @12;        # reads the reference or harness, replays, patches jax/numpy
  timeout @13;           # the per-request deadline passed; the worker was restarted
  crash @14;             # the worker died (segfault, os._exit); it was restarted
  sandboxViolation @15;  # network, files outside the private directory, credentials
  resourceLimit @16;     # memory, CPU time, file size, processes
  badInput @17;          # the spec or task is invalid (not the candidate's fault)
  internal @18;          # a bug in maxkernel itself
  tooLarge @19;          # the task's inputs cannot fit in memory
  vmemOom @20;           # the kernel's blocks and scratch exceed the VMEM limit
  overloaded @21;        # the node's queue was full; retry elsewhere or later
}

struct PhaseResult {
  phase @0 :Phase;
  status @1 :Status;
  errorClass @2 :ErrorClass;
  message @3 :Text;
  seconds @4 :Float64;
}

struct TestCase {
  configuration @0 :UInt32;
  seed @1 :UInt64;
  kind @2 :Text;              # fresh, redrawn-normal, ...
  reduced @3 :Bool;
  inputShapes @4 :Text;       # readable, e.g. "(256,512) bfloat16, (512,256) bfloat16"
  passed @5 :Bool;
  output @6 :Int32;           # worst output index, -1 when not applicable
  maxAbsErr @7 :Float64;
  maxRelErr @8 :Float64;
  worstIndex @9 :List(Int64);
  message @10 :Text;
}

struct TestReport {
  cases @0 :List(TestCase);
  degenerateReference @1 :Bool;   # the reference's output barely depends on its inputs
  notes @2 :List(Text);
}

struct EvalOptions {
  seeds @0 :List(UInt64);     # empty: the worker's defaults
  full @1 :Bool;              # test at the spec's full shapes, not reduced ones
  timeRuns @2 :UInt32 = 10;
  warmupRuns @3 :UInt32 = 3;
  chip @4 :Text;
  configuration @5 :UInt32;   # which of the spec's configurations to time
  profileOnly @6 :Bool;       # lower, extract and profile; no test (`model` on further chips)
  # The tester's choices (agents/tester): how the test inputs are drawn and sized.
  valueMode @7 :Text;         # "": the spec's generators; "large": float inputs x valueScale;
                              # "zeros": float inputs all zero; "sparse": half of them zero
  valueScale @8 :Float64;     # for "large" (0: the worker's default)
  shapeMode @9 :Text;         # "": reduced (or full); "ragged": reduced sizes that leave a
                              # partial last block against the (8, 128) tile
  storeScope @10 :Text;       # stored results answer only requests of the same scope ("": the
                              # shared one); `bench --modes` on a cluster gives each mode its own
}

struct EvalRequest {
  schemaVersion @0 :UInt32;
  spec @1 :KernelSpec;
  candidate @2 :Candidate;
  options @3 :EvalOptions;
  reference @4 :Bool;         # evaluate the spec's reference (time only), not the candidate
}

struct EvalResult {
  schemaVersion @0 :UInt32;
  candidateId @1 :Text;
  phases @2 :List(PhaseResult);
  correct @3 :Bool;
  test @4 :TestReport;
  structure @5 :KernelStructure;
  profile @6 :Profile;
  hasStructure @7 :Bool;
  hasProfile @8 :Bool;
  backend @9 :Text;           # model | jax-tpu
  cached @10 :Bool;           # answered from the evaluation store
  key @11 :Text;              # the evaluation key (hex)
}
