#include "cli/workload_cli.hpp"

#include "cli/optimize_cli.hpp"

#include <CLI/CLI.hpp>

namespace maxkernel::cli {

CLI::App* add_workload_command(CLI::App& app, workload_options& opts,
                               const std::vector<std::string>& chips) {
  auto* cmd = app.add_subcommand(
    "workload", "expand a whole model (bench/workloads/MODEL.yaml) into the kernel tasks of one "
                "step, search them all at once, and report each task's speedup and the step "
                "time before and after (docs/workloads.md)");
  cmd->add_option("MODEL", opts.model, "a workload file: the model's shape and the step's batch")
    ->required();
  cmd->add_option("--mode", opts.mode, "auto | graph (default graph)")
    ->check(CLI::IsMember({"auto", "graph"}));
  cmd->add_option("--phase", opts.phase,
                  "prefill (batch x seq_len tokens, with the loss) | decode (one token per "
                  "sequence against kv_len cached ones); default prefill")
    ->check(CLI::IsMember({"prefill", "decode"}));
  cmd->add_option("--tasks", opts.tasks,
                  "only the tasks whose name or role matches one of these comma-separated globs");
  cmd->add_option("--jobs", opts.jobs, "tasks searched at once (default: two per worker; with --cluster, all)")
    ->check(CLI::Range(1u, 256u));
  cmd->add_option("--json", opts.json, "write the report as JSON to FILE, or - for stdout");
  cmd->add_option("--out", opts.out,
                  "write the specs to DIR/specs/PHASE/ and each task's kernel.py, result.json "
                  "and report to DIR/MODE/TASK/");
  cmd->add_option("--cluster", opts.cluster,
                  "submit every task to a running cluster: the supervisor's client port "
                  "HOST:PORT (docs/cluster.md); the report is written here as without it");
  cmd->add_option("--token-file", opts.token_file,
                  "with --cluster: the cluster's credentials (cluster init DIR: DIR/token)");
  add_search_options(cmd, opts.search, chips);
  for (auto* o : cmd->get_options())
    if (o->get_name() == "--budget-evals")
      o->description("candidates to evaluate per task (default 16; 0: no cap)");
  return cmd;
}

}  // namespace maxkernel::cli
