# The human in the loop (actors/hitl_supervisor, cluster/operator_gateway, docs/modes.md):
# the hitl supervisor sends each evaluated candidate as a Proposal to the operator gateway and
# waits for a Decision. Operator shells attach to the gateway over ZeroMQ (a DEALER socket to
# its ROUTER; each frame one Cap'n Proto message): shells send OperatorCommand, the gateway
# sends OperatorEvent. Every proposal and decision goes into the search's transcript.
@0xb0898fa32944f1ac;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");
using import "candidate.capnp".Param;
using import "search.capnp".Vertex;

struct Proposal {
  schemaVersion @0 :UInt32;
  seq @1 :UInt32;              # the proposal's number in this search, from 1
  task @2 :Text;
  chip @3 :Text;
  timing @4 :Text;             # modeled | measured
  vertex @5 :Vertex;           # the evaluated candidate: plan step (strategy, rationale),
                               # candidate, result, verdict, diagnosis
  expectedEffect @6 :Text;     # the planner's expected effect of the step
  diff @7 :Text;               # unified diff of the kernel source against its parent's
                               # (against nothing for a first candidate)
  parentTimeUs @8 :Float64;    # 0 when no parent or the parent has no time
  bestIndex @9 :Int32 = -1;    # the best accepted correct vertex before this one
  bestTimeUs @10 :Float64;
  referenceTimeUs @11 :Float64;
  evaluations @12 :UInt32;     # candidates evaluated so far
  budgetEvals @13 :UInt32;
  autoSteps @14 :UInt32;       # > 0: handed over to auto; no decision is asked (a notice)
}

enum DecisionKind {
  approve @0;    # accept the proposal; the next plan starts from the best accepted
  reject @1;     # refuse it; `text` (feedback) goes to the planner
  edit @2;       # evaluate a change of it: `changes` (parameters) or `source` (the module)
  hint @3;       # accept it; `text` steers the next plans
  takeOver @4;   # evaluate the operator's own kernel (`source`) instead of it
  handOver @5;   # accept it and let auto decide the next `steps` proposals
  stop @6;       # end the search now
}

struct Decision {
  schemaVersion @0 :UInt32;
  seq @1 :UInt32;              # the proposal it answers
  kind @2 :DecisionKind;
  text @3 :Text;               # reject: feedback; hint: the hint
  changes @4 :List(Param);     # edit: parameter -> new value (JSON literal)
  source @5 :Text;             # edit (when no changes) and takeOver: a Python module
  steps @6 :UInt32;            # handOver
  operator @7 :Text;           # who decided ("policy" for a timeout, "auto" when handed over)
}

# gateway -> shell
struct OperatorEvent {
  schemaVersion @0 :UInt32;
  union {
    welcome @1 :Text;          # on attach: the search (task, mode, chip, endpoint)
    proposal @2 :Proposal;     # a decision is wanted (or, with autoSteps, a notice)
    decided @3 :Decision;      # a proposal was decided (by any shell, the policy or auto)
    notice @4 :Text;           # progress: what the supervisor just did
    refused @5 :Text;          # the shell's last command was not accepted, and why
    ended @6 :Text;            # the search ended: reason and best result
    pong @7 :Void;             # the answer to a ping: a shell that hears nothing for a while
                               # knows the gateway is gone
  }
}

# shell -> gateway
struct OperatorCommand {
  schemaVersion @0 :UInt32;
  union {
    attach @1 :Text;           # the operator's name; answered with welcome (+ the waiting
                               # proposal, if any)
    decision @2 :Decision;
    ping @3 :Void;             # keeps the attachment alive (a shell silent for the gateway's
                               # liveness period is detached); answered with pong
    detach @4 :Void;
    release @5 :Void;          # gives up the hitl floor: one shell decides at a time, the
                               # first to decide holds it until it releases it or detaches
  }
}

# One line of the persisted transcript (search/search_graph keeps them per search).
struct TranscriptEntry {
  seq @0 :UInt32;              # the proposal it belongs to
  timeUnixMs @1 :Int64;
  union {
    proposal @2 :Proposal;
    decision @3 :Decision;
    note @4 :Text;             # a timeout, a refused decision, the end
  }
}
