// Atoms of the actor protocols (CAF 0.17: atom_constant, at most 10 characters).
#pragma once

#include <caf/atom.hpp>

namespace maxkernel::messages {

using evaluate_atom = caf::atom_constant<caf::atom("evaluate")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using analyze_atom = caf::atom_constant<caf::atom("analyze")>;
using info_atom = caf::atom_constant<caf::atom("info")>;
// The JAX version (and backend) a worker pool evaluates with: part of every evaluation key.
using version_atom = caf::atom_constant<caf::atom("version")>;
// The profiler: ProfilerRequest -> Diagnosis.
using diagnose_atom = caf::atom_constant<caf::atom("diagnose")>;
// The planner: PlannerRequest -> Plan.
using plan_atom = caf::atom_constant<caf::atom("plan")>;
// The implementer: ImplementRequest -> ImplementReply.
using implement_atom = caf::atom_constant<caf::atom("implement")>;
// The debugger: DebugRequest -> DebugReply.
using debug_atom = caf::atom_constant<caf::atom("debug")>;
// The tester: TesterRequest -> TestPlan, and JudgeRequest -> Verdict.
using testplan_atom = caf::atom_constant<caf::atom("testplan")>;
using judge_atom = caf::atom_constant<caf::atom("judge")>;
// A supervisor: OptimizeRequest -> OptimizeResult; Progress to its listener while it runs.
using optimize_atom = caf::atom_constant<caf::atom("optimize")>;
using progress_atom = caf::atom_constant<caf::atom("progress")>;
using control_atom = caf::atom_constant<caf::atom("control")>;
// The dispatcher: -> DispatcherStatus; a node joins the set it dispatches to.
using status_atom = caf::atom_constant<caf::atom("status")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
// The operator gateway: Proposal -> Decision; OperatorEvent notices to the attached shells.
using propose_atom = caf::atom_constant<caf::atom("propose")>;
using notify_atom = caf::atom_constant<caf::atom("notify")>;

}  // namespace maxkernel::messages
