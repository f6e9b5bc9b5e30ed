// The profiler's brain: a Profile (modeled or measured), the candidate's KernelStructure and
// the chip -> a Diagnosis: the bound, the bottleneck call and operand, the headroom to
// roofline and structured suggestions, each with a rationale that carries its numbers.
// Pure and deterministic: it reads only the numbers it is given, never task names.
// docs/agents.md describes the rules.
#pragma once

#include "config/chip.hpp"
#include "maxkernel/schema/agent.capnp.h"

namespace maxkernel::agents {

void diagnose(schema::ProfilerRequest::Reader request, const config::chip& chip,
              schema::Diagnosis::Builder out);

}  // namespace maxkernel::agents
