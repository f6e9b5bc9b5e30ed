// `maxkernel optimize SPEC --mode auto|graph|hitl [--chip v6e] [--nodes N] [--workers N]
// [--budget-evals N] [--budget-seconds S] [--seed S] [--out DIR] [--state-dir DIR]
// [--json FILE|-] [--resume] ...`: the embedded default. One process: N tpu_nodes on the
// model backend (simulated devices) sharing a worker pool, a dispatcher in front of them,
// the agent pool and the mode's supervisor (hitl: and the operator gateway, where shells
// attach with `maxkernel attach ENDPOINT`). The search graph is persisted as it grows in
// the state directory (`--resume` continues a killed search). Writes DIR/kernel.py (the best
// kernel, JAXBench convention), DIR/result.json (ARCHITECTURE.md, "Contracts"),
// DIR/search.sqlite (the search alone), DIR/graph.json, DIR/graph.dot and DIR/report.html
// (hitl: and DIR/transcript.jsonl).
// Exit 0 with a correct kernel, 1 when none was found (kernel.py is then the reference), 2 bad
// input, 3 environment errors.
#pragma once

#include "cli/spec_source.hpp"
#include "config/brain_config.hpp"

#include <cstdint>
#include <string>

namespace maxkernel::cli {

struct optimize_options {
  std::string spec;
  std::string mode = "auto";     // auto | graph | hitl
  std::string chip;
  unsigned nodes = 8;            // simulated devices on the model backend
  unsigned workers = 0;          // JAX workers shared by the nodes; 0: one per core
  unsigned budget_evals = 24;    // candidates to evaluate; 0: no cap
  double budget_seconds = 0;     // 0: no cap
  unsigned patience = 0;         // steps without a faster candidate before stopping; 0: never
  double target_roofline = 0;    // stop at this fraction of roofline; 0: never
  unsigned beam_width = 4;       // graph: vertices expanded per round
  unsigned branching = 3;        // graph: children per vertex
  std::string policy = "beam";   // graph: beam | bandit
  bool no_dive = false;          // graph: breadth every round (SearchSettings.dive off)
  unsigned max_repairs = 3;
  bool test_every_candidate = false;  // the tester's cases also for candidates not faster
                                      // than the best (SearchSettings.testEveryCandidate)
  uint64_t seed = 0;
  std::string out;               // directory ("" = none)
  std::string state_dir;
  std::string json;              // "" none, "-" stdout, else a file
  std::string brains;            // brain config file ("" = every role expert)
  bool resume = false;
  bool no_store = false;
  std::string store_scope;       // EvalOptions.storeScope ("": the shared results)
  double deadline_seconds = 600;
  uint64_t memory_limit_bytes = 8ull << 30;
  unsigned simulate_device_ms = 0;
  // hitl
  std::string operator_endpoint = "tcp://127.0.0.1:*";
  double operator_timeout = 0;   // seconds a proposal waits; 0: forever
  std::string on_timeout = "wait";
  bool console = false;          // this terminal attaches as an operator (stdin, stdout)
  // Set by a cluster's supervisor, not a flag: shells attach to the gateway with the
  // cluster's credentials (CURVE).
  std::string operator_token_file;
};

// Command-line checks that need no worker (exit 2 with the reason when false).
bool valid_optimize_options(const optimize_options& opts, std::string& error);

// What every optimize run reads before its session: the options checked, the spec's kind
// and the brain config. False with `error` (bad input, exit code 2).
bool read_optimize_inputs(const optimize_options& opts, spec_kind& kind,
                          config::brain_config& brains, std::string& error);

int run_optimize(const optimize_options& opts);

}  // namespace maxkernel::cli
