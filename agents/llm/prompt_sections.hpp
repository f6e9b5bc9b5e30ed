// The request's data as the text the prompts' placeholders receive: the chip's numbers, the
// spec and its reference, the analyze summary, the history with results and profiles, a
// plan step, a failed evaluation. Plain text and markdown, compact, numbers with units; the
// same request always renders the same text.
#pragma once

#include "config/chip.hpp"
#include "maxkernel/schema/agent.capnp.h"

#include <string>

namespace maxkernel::agents::llm {

std::string render_chip(const config::chip& chip);
std::string render_spec(schema::KernelSpec::Reader spec);
std::string render_analysis(schema::DataflowGraph::Reader graph);
// One line per candidate (id, lineage, outcome, time and roofline share, diagnosis), oldest
// first; the most recent entries when there are many.
std::string render_history(capnp::List<schema::HistoryEntry>::Reader history);
std::string render_profile(schema::Profile::Reader profile);
std::string render_structure(schema::KernelStructure::Reader structure);
std::string render_diagnosis(schema::Diagnosis::Reader diagnosis);
std::string render_step(schema::PlanStep::Reader step);
std::string render_params(capnp::List<schema::Param>::Reader params);
// What failed: each failed phase with its error class and message, the failing test cases.
std::string render_failure(schema::EvalResult::Reader result);

// Index into history of the candidate to improve: the fastest correct one (ties: the later),
// else the latest; -1 when the history is empty.
int best_entry(capnp::List<schema::HistoryEntry>::Reader history);

}  // namespace maxkernel::agents::llm
