// `maxkernel bench SUITE [--mode auto|graph] [--modes auto,graph,hitl-hint] [--chip v6e]
// [--budget-evals N] [--tasks GLOB] [--jobs N] [--json FILE|-] [--html FILE] [--out DIR] ...`:
// runs every task of a suite (native specs, JAXBench and MaxKernel task directories, mixed;
// cli/bench_suite) through `optimize`'s search, several tasks at once over one process's
// nodes, and reports per task and aggregated (cli/bench_summary, docs/bench.md). With several
// modes, each mode runs the whole suite on its own evaluation store (so none is answered from
// another's work) and the modes are compared on quality against cost. `hitl-hint` is hitl with
// a scripted operator that relays the profiler's top suggestion as a hint (cli/hint_operator).
// Exit 0 when every task has a correct kernel, 1 when some task has none (or failed: it is a
// row of the report, never dropped), 2 bad input (command line, a suite without tasks), 3
// environment errors.
#pragma once

#include "cli/bench_suite.hpp"
#include "cli/optimize_command.hpp"

#include <nlohmann/json.hpp>

#include <iosfwd>
#include <string>
#include <vector>

namespace maxkernel::cli {

struct bench_options {
  std::string suite;
  std::string modes = "graph";  // --mode or --modes: comma-separated auto, graph, hitl-hint
  std::string tasks;            // glob over task names or suite-relative paths ("" all)
  unsigned jobs = 0;            // tasks searched at once; 0: two per JAX worker
  std::string json;             // "" none, "-" stdout, else a file
  std::string html;             // the report page ("" none)
  std::string out;              // DIR/<mode>/<task>/ receives optimize's outputs ("" none)
  optimize_options search;      // each task's search settings (spec, mode, json, out unused)
  // --cluster HOST:PORT: each task is an optimize submission to that supervisor's client
  // port (cli/cluster_client), `jobs` at once (0: all); the report is built as embedded.
  std::string cluster;
  std::string token_file;       // with cluster: the cluster's credentials
};

int run_bench(const bench_options& opts);

// The same over tasks the caller found (opts.suite and opts.tasks only label the run; the
// workload command's expanded specs): every mode's summary to `human` and the bench JSON,
// as --json would write it, in `bench`; writes neither --json nor --html. Exit codes as
// run_bench's.
int run_bench_tasks(const bench_options& opts, const std::vector<suite_task>& tasks,
                    std::ostream& human, nlohmann::json& bench);

}  // namespace maxkernel::cli
