# The supervisors' messages (actors/, docs/modes.md): `maxkernel optimize` hands a supervisor
# an OptimizeRequest (the task, the reference's analyze summary, the search settings) and gets
# an OptimizeResult (the search graph's vertices and the best correct one). While it runs the
# supervisor sends Progress to its listener. The graph is persisted by search/search_graph as
# it grows; a Vertex is also what that database stores.
@0xf7e67a0e6ddd73c6;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");
using import "kernel_structure.capnp".DataflowGraph;
using import "kernel_spec.capnp".KernelSpec;
using import "candidate.capnp".Candidate;
using import "eval.capnp".EvalResult;
using import "agent.capnp".Diagnosis;
using import "agent.capnp".Usage;

struct SearchSettings {
  mode @0 :Text;               # auto | graph | hitl
  chip @1 :Text;
  seed @2 :UInt64;
  budgetEvals @3 :UInt32;      # candidates to evaluate (each with the tester's cases); 0: no cap
  budgetSeconds @4 :Float64;   # wall time; 0: no cap (a search cut by time is not reproducible)
  maxRepairs @5 :UInt32;       # debugger attempts per lineage
  patience @6 :UInt32;         # stop after this many iterations (auto) or rounds (graph)
                               # without a faster correct candidate; 0: never
  targetRoofline @7 :Float64;  # stop once the best reaches this fraction of roofline; 0: never
  beamWidth @8 :UInt32;        # graph: frontier vertices expanded per round
  branching @9 :UInt32;        # graph: children asked of the planner per vertex
  policy @10 :Text;            # graph: beam | bandit
  deadlineMs @11 :UInt32;      # per evaluation request; 0: the node's default
  operatorTimeoutSeconds @12 :Float64;  # hitl: how long a proposal waits for a decision;
                               # 0: forever
  onTimeout @13 :Text;         # hitl: wait (keep waiting) | approve | stop
  testEveryCandidate @14 :Bool; # the tester's cases for every candidate that passes the node's
                               # test; false: only for one faster than the best when its step
                               # started (the others cannot become the result)
  storeScope @15 :Text;        # EvalOptions.storeScope of every request of the search
  dive @16 :Bool = true;       # graph: after a round that found a faster vertex, the next
                               # round is one child, the planner's first new move from it;
                               # breadth again once a round finds nothing faster
}

struct OptimizeRequest {
  schemaVersion @0 :UInt32;
  spec @1 :KernelSpec;
  analysis @2 :DataflowGraph;  # the reference's analyze summary (configuration 0)
  settings @3 :SearchSettings;
  referenceTimeUs @4 :Float64; # for speedups in progress reports; 0 when unknown
  graphPath @5 :Text;          # the search graph's SQLite file ("" = not persisted)
  resume @6 :Bool;             # continue the search of the same key found in graphPath
                               # (else it is replaced)
}

enum VertexState {
  pending @0;      # fixed, not evaluated yet (a resumed search dispatches it again)
  evaluated @1;    # its result, verdict and diagnosis are in
  failed @2;       # did not lower or test correctly after the debugger's attempts
}

struct Vertex {
  index @0 :UInt32;            # its position in the graph: creation order, 0-based
  parent @1 :Int32 = -1;       # the vertex it was derived from; -1 for a first candidate
  strategy @2 :Text;           # the move that made it ("template", "growBlock {...}", a fix)
  round @3 :UInt32;            # auto: iteration; graph: round
  state @4 :VertexState;
  candidate @5 :Candidate;     # the last candidate of its lineage (after repairs)
  result @6 :EvalResult;       # its evaluation at the default options, when hasResult
  hasResult @7 :Bool;
  correct @8 :Bool;            # passed the node's test and every one of the tester's cases
                               # (the node's test alone when casesSkipped)
  verdict @9 :Text;            # the tester's summary, or why it failed
  failureClass @10 :Text;      # "" when correct
  timeUs @11 :Float64;         # the profile's time (modeled or measured); 0 when none
  rooflineUs @12 :Float64;
  diagnosis @13 :Diagnosis;    # the profiler's, when hasDiagnosis
  hasDiagnosis @14 :Bool;
  repairs @15 :UInt32;         # debugger fixes applied to reach `candidate`
  evaluations @16 :UInt32;     # evaluation requests it took (cases and repairs included)
  cacheHits @17 :UInt32;
  rationale @18 :Text;         # the planner's rationale for the step
  attemptFailures @19 :List(Text);  # the failure class of each failed evaluation of its
                                    # lineage (repairs and tester cases), in order
  exhausted @20 :Bool;         # graph: the planner had no new move from it (never expanded again)
  decision @21 :Text;          # hitl: awaiting | approved | rejected | edited | replaced |
                               # stopped (the search was stopped on it);
                               # "" in auto and graph. Only "" and approved vertices can be
                               # the best or a plan's parent.
  feedback @22 :Text;          # hitl: the operator's feedback or hint on it
  expectedEffect @23 :Text;    # the planner's expected effect of the step
  casesSkipped @24 :Bool;      # correct on the node's test alone: its time was not faster than
                               # the best when its step started, so it could not become the
                               # result and the tester's cases were not run (verdict says so)
  triedIds @25 :List(Text);    # the ids of the candidates its lineage evaluated before
                               # `candidate` (the first, then each repair but the last): a
                               # planner's step that yields one of them again is not new
}

struct FailureCount {
  failureClass @0 :Text;
  count @1 :UInt32;
}

struct Progress {
  evaluations @0 :UInt32;      # candidates evaluated so far
  budgetEvals @1 :UInt32;
  bestTimeUs @2 :Float64;      # 0 while nothing is correct
  bestSpeedup @3 :Float64;     # against the reference; 0 when unknown
  round @4 :UInt32;
  inFlight @5 :UInt32;         # evaluation requests out at the nodes
  message @6 :Text;            # what just happened, one line
  paused @7 :Bool;             # an operator paused it (SearchControl)
}

# An operator's control of a running search (`maxkernel shell`: stop, pause, resume,
# budget). Answered with the search's Progress as it stands after the change.
struct SearchControl {
  union {
    stop @0 :Text;             # the reason given; the search ends at its next step boundary
    pause @1 :Void;            # in-flight candidates finish; no new step starts
    resume @2 :Void;
    budgetEvals @3 :UInt32;    # the new cap on candidates (0: none); below done = stop
  }
}

struct OptimizeResult {
  schemaVersion @0 :UInt32;
  vertices @1 :List(Vertex);   # the whole graph, index order
  best @2 :Int32 = -1;         # the fastest correct vertex; -1 when none
  candidatesEvaluated @3 :UInt32;
  evaluations @4 :UInt32;      # evaluation requests (tester cases and repairs included)
  cacheHits @5 :UInt32;
  failures @6 :List(FailureCount);
  usage @7 :Usage;
  stopReason @8 :Text;         # budget, time, stagnation, roofline, exhausted; hitl: operator
                               # (a stop decision), timeout (the stop policy)
  rounds @9 :UInt32;
  resumed @10 :Bool;           # it continued a search found in graphPath
  bestPerEvaluation @11 :List(Float64);  # best correct time after each candidate (0: none yet)
  transcript @12 :List(Data);  # hitl: TranscriptEntry bytes (operator.capnp), in order
}
