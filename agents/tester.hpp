// The tester's brain: which evaluations make a candidate "correct" for a spec, and the
// verdict on their results. Pure and deterministic given the request's seed; it reads the
// spec's inputs, sizes, dtypes and tolerances (never task names). docs/agents.md ("The
// tester") describes the cases and the rules.
#pragma once

#include "maxkernel/schema/agent.capnp.h"

#include <cstdint>
#include <string>

namespace maxkernel::agents {

// Limits of the rules (docs/agents.md).
struct tester_limits {
  // A thorough plan tests at the spec's full shapes when every configuration's inputs and
  // outputs fit in full_bytes and the reference's flops (analysis, else spec.flops) stay
  // within full_flops: interpret mode runs the grid step by step on the CPU.
  static constexpr double full_bytes = 16.0 * 1024 * 1024;
  static constexpr double full_flops = 2e9;
  // Seeds of the fresh-inputs case (quick / thorough) and of every other case. Quick: one.
  // The node's own test already runs the spec's generators at the same reduced sizes on 3
  // seeds (the worker's defaults), with the checks that need several seeds (a constant or
  // replayed answer, a degenerate reference); the case adds inputs the node's test never
  // used (a kernel fitted to the known seeds fails it): one draw does that; more draws of
  // the same generators at the same sizes add little for 3x the interpret-mode runs.
  // Thorough plans (full shapes where the task is small) keep five.
  static constexpr unsigned fresh_seeds = 1;
  static constexpr unsigned thorough_fresh_seeds = 5;
  static constexpr unsigned mode_seeds = 1;
  static constexpr unsigned thorough_mode_seeds = 2;
  // Large magnitudes: inputs times large_scale, asked for only when every float output's
  // rtol is at least large_ulps machine epsilons of its dtype (with atol negligible next to
  // the scaled outputs, rtol alone must absorb the last-bit rounding of kernel and reference).
  static constexpr double large_scale = 1000.0;
  static constexpr double large_ulps = 2.0;
  // worker's default tolerance when the spec gives none (JAXBench's harness default)
  static constexpr double default_tolerance = 1e-2;
};

// Fills `out` with the cases to evaluate (all must pass). False, with `error` naming the
// field, when the request cannot be acted on (a spec without configurations).
bool choose_tests(schema::TesterRequest::Reader request, schema::TestPlan::Builder out,
                  std::string& error);

// Fills `out`: correct when no case failed and at least one passed (a case skipped by the
// worker because the reference disallows its inputs, with the reason, does not fail).
// False, with `error`, when results and plan cases do not correspond one to one.
bool judge(schema::JudgeRequest::Reader request, schema::Verdict::Builder out,
           std::string& error);

// The seed of case `index` of a plan made with `seed` (in 1 .. 2^31-1; distinct per index).
uint64_t case_seed(uint64_t seed, unsigned index);

}  // namespace maxkernel::agents
