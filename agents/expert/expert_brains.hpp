// The expert brain (the default; offline and deterministic): the planner matches the
// reference against the templates and, once candidates have profiles, ranks playbook moves
// from the best one's diagnosis; the implementer renders templates; the debugger applies the
// repair rules. Decisions read the analyze summary, profiles and chip numbers only.
#pragma once

#include "agents/brain.hpp"
#include "agents/expert/kernel_template.hpp"

#include <vector>

namespace maxkernel::agents::expert {

// Over `templates` (default: every family of the registry; tests pass their own).
planner_brain_ptr make_expert_planner(std::vector<template_ptr> templates = {});
implementer_brain_ptr make_expert_implementer(std::vector<template_ptr> templates = {});
debugger_brain_ptr make_expert_debugger(std::vector<template_ptr> templates = {});

}  // namespace maxkernel::agents::expert
