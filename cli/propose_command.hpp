// `maxkernel propose SPEC [--chip v6e] [--out DIR] [--json FILE|-] [--brains FILE]`: the
// agent pool's first answer for a task. The planner and implementer produce a first
// candidate, the node lowers, tests and profiles it, the debugger repairs failures (up to
// --max-repairs per lineage; the next plan step when a lineage gives up), and the tester's
// cases (seeds, reduced configurations, ragged shapes, adversarial values) judge it.
// Writes DIR/kernel.py and DIR/result.json (ARCHITECTURE.md, "Contracts"). Exit 0 with a
// correct kernel; 1 when none came out (kernel.py is then the reference); 2 bad input, or
// the expert brain has no template and no LLM is configured; 3 environment errors.
#pragma once

#include <cstdint>
#include <string>

namespace maxkernel::cli {

struct propose_options {
  std::string spec;
  std::string chip;
  std::string out;            // directory ("" = none)
  std::string json;           // "" none, "-" stdout, else a file
  std::string brains;         // brain config file ("" = every role expert)
  std::string state_dir;
  bool no_store = false;
  unsigned max_repairs = 3;   // debugger attempts per lineage
  unsigned max_steps = 3;     // plan steps (lineages) tried
  uint64_t seed = 0;
  double deadline_seconds = 600;
  uint64_t memory_limit_bytes = 8ull << 30;
};

int run_propose(const propose_options& opts);

}  // namespace maxkernel::cli
