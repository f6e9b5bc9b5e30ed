// `maxkernel workload MODEL.yaml [--mode auto|graph] [--phase prefill|decode] [--tasks GLOB]
// [--budget-evals N] [--jobs N] [--json F] [--out DIR] [the search options]`
// (docs/workloads.md): expands a whole-model workload (config/workload_expansion) into the
// kernel tasks of one step, writes them as native specs, searches them all at once through
// the bench machinery (cli/bench_command), and reports each task's speedup and the step time
// before and after, weighted by occurrence (cli/workload_report). Exit codes as bench's: 0
// every task has a correct kernel, 1 some has none, 2 bad input, 3 environment errors.
#pragma once

#include "cli/optimize_command.hpp"

#include <string>

namespace maxkernel::cli {

struct workload_options {
  std::string model;            // bench/workloads/MODEL.yaml
  std::string mode = "graph";   // auto | graph
  std::string phase = "prefill";  // prefill | decode
  std::string tasks;            // comma-separated globs over task names and roles ("" all)
  unsigned jobs = 0;            // tasks searched at once; 0: two per JAX worker
  std::string json;             // "" none, "-" stdout, else a file
  std::string out;              // DIR/specs/ the specs, DIR/MODE/TASK/ each task's outputs
  optimize_options search;      // each task's search settings (spec, mode, json, out unused)
  std::string cluster;          // --cluster HOST:PORT: the tasks are submitted there (bench's)
  std::string token_file;

  workload_options() { search.budget_evals = 16; }
};

int run_workload(const workload_options& opts);

}  // namespace maxkernel::cli
