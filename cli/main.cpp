// The maxkernel program: parses the command line and runs one command.
#include "cli/bench_command.hpp"
#include "cli/calibrate_command.hpp"
#include "cli/check_command.hpp"
#include "cli/model_command.hpp"
#include "cli/operator_console.hpp"
#include "cli/optimize_command.hpp"
#include "cli/propose_command.hpp"
#include "cli/template_command.hpp"
#include "cli/spec_command.hpp"
#include "config/chip_names.hpp"
#include "messages/version.hpp"

#include <CLI/CLI.hpp>

#include <iostream>

// The settings of a task's search, shared by `optimize` and `bench`.
void add_search_options(CLI::App* cmd, maxkernel::cli::optimize_options& opt,
                        const std::vector<std::string>& chips) {
  cmd->add_option("--chip", opt.chip, "target chip (wins over the spec's)")
    ->check(CLI::IsMember(chips));
  cmd->add_option("--nodes", opt.nodes, "simulated TPU devices (default 8)")
    ->check(CLI::Range(1u, 4096u));
  cmd->add_option("--workers", opt.workers,
                  "JAX workers the nodes share (default: one per core)");
  cmd->add_option("--budget-evals", opt.budget_evals,
                  "candidates to evaluate (default 24; 0: no cap)");
  cmd->add_option("--budget-seconds", opt.budget_seconds,
                  "wall-time budget (0: none; a search cut by time is not reproducible)")
    ->check(CLI::NonNegativeNumber);
  cmd->add_option("--patience", opt.patience,
                  "stop after this many candidates (auto) or rounds (graph) without a "
                  "faster one (0: never)");
  cmd->add_option("--target-roofline", opt.target_roofline,
                  "stop once the best kernel reaches this fraction of roofline");
  cmd->add_option("--beam-width", opt.beam_width, "graph: vertices expanded per round")
    ->check(CLI::Range(1u, 64u));
  cmd->add_option("--branching", opt.branching, "graph: children per expanded vertex")
    ->check(CLI::Range(1u, 64u));
  cmd->add_option("--policy", opt.policy, "graph: frontier selection, beam | bandit")
    ->check(CLI::IsMember({"beam", "bandit"}));
  cmd->add_option("--max-repairs", opt.max_repairs, "debugger attempts per lineage")
    ->check(CLI::Range(0u, 20u));
  cmd->add_option("--seed", opt.seed, "seed of the brains, the tester and the policy");
  cmd->add_option("--state-dir", opt.state_dir,
                  "where the evaluation store and the search graphs live");
  cmd->add_option("--brains", opt.brains,
                  "brain config YAML (docs/brains.md; default: every role expert)");
  cmd->add_flag("--resume", opt.resume,
                "continue the search of this spec, mode, chip and seed from the state "
                "directory (nothing that finished is evaluated again)");
  cmd->add_flag("--no-store", opt.no_store,
                "neither answer from nor record in the evaluation store");
  cmd->add_option("--deadline", opt.deadline_seconds, "seconds per evaluation")
    ->check(CLI::PositiveNumber);
  cmd->add_option("--simulate-device-ms", opt.simulate_device_ms,
                  "model backend: simulated device time per evaluation");
  cmd->add_option("--memory-limit", opt.memory_limit_bytes,
                  "bytes the task's inputs may take")
    ->check(CLI::PositiveNumber);
}

int main(int argc, char** argv) {
  CLI::App app{"maxkernel: writes and optimizes Pallas TPU kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", maxkernel::messages::maxkernel_version());
  // The chips are data (config/chips/*.yaml): a new generation is a new file.
  const auto chips = maxkernel::config::chip_names();

  maxkernel::cli::check_options check;
  auto* check_cmd = app.add_subcommand(
    "check", "load, lower for TPU, test in interpret mode (and time on a TPU host) one kernel");
  check_cmd->add_option("SPEC", check.spec,
                        "task: a native .yaml spec, a JAXBench or a MaxKernel task directory")
    ->required();
  check_cmd->add_option("KERNEL", check.kernel, "kernel file defining workload(*inputs)");
  check_cmd->add_flag("--baseline", check.baseline, "check the spec's own baseline kernel");
  check_cmd->add_option("--chip", check.chip, "target chip (wins over the spec's)")
    ->check(CLI::IsMember(chips));
  check_cmd->add_flag("--full", check.full, "test at the task's full shapes");
  check_cmd->add_flag("--reference-only", check.reference_only,
                      "model (or time) the spec's reference alone");
  check_cmd->add_option("--state-dir", check.state_dir,
                        "where the evaluation store lives (default: $MAXKERNEL_STATE_DIR, else "
                        "$XDG_STATE_HOME/maxkernel, else ~/.local/state/maxkernel)");
  check_cmd->add_flag("--no-store", check.no_store,
                      "neither answer from nor record in the evaluation store");
  check_cmd->add_option("--simulate-device-ms", check.simulate_device_ms,
                        "model backend: simulated device time per evaluation");
  check_cmd->add_option("--json", check.json, "write the result as JSON to FILE, or - for stdout");
  check_cmd->add_option("--seed", check.seeds, "seeds of the test inputs (repeatable)");
  check_cmd->add_option("--deadline", check.deadline_seconds, "seconds per worker request")
    ->check(CLI::PositiveNumber);
  check_cmd->add_option("--memory-limit", check.memory_limit_bytes,
                        "bytes the task's inputs may take")
    ->check(CLI::PositiveNumber);

  maxkernel::cli::spec_options spec;
  auto* spec_cmd = app.add_subcommand("spec", "show how a task spec is read (dims, inputs, tolerances)");
  spec_cmd->add_option("SPEC", spec.spec,
                       "task: a native .yaml spec, a JAXBench or a MaxKernel task directory")
    ->required();
  spec_cmd->add_option("--chip", spec.chip, "target chip (wins over the spec's)")
    ->check(CLI::IsMember(chips));
  spec_cmd->add_option("--json", spec.json, "write the KernelSpec as JSON to FILE, or - for stdout");
  spec_cmd->add_option("--out", spec.out, "write the KernelSpec as binary Cap'n Proto to FILE");
  spec_cmd->add_option("--memory-limit", spec.memory_limit_bytes, "bytes the task's inputs may take")
    ->check(CLI::PositiveNumber);

  maxkernel::cli::calibrate_options calibrate;
  auto* calibrate_cmd = app.add_subcommand(
    "calibrate", "fit a chip's model constants to measured times and write the fitted chip file");
  calibrate_cmd->add_option("MEASUREMENTS", calibrate.measurements,
                            "CSV: spec, kernel (a file or 'reference'), chip, measured_us, source")
    ->required();
  calibrate_cmd->add_option("--chip", calibrate.chip, "the chip whose rows to fit")
    ->required()
    ->check(CLI::IsMember(chips));
  calibrate_cmd->add_option("--out", calibrate.out,
                            "fitted chip file (default ./<chip>.fitted.yaml)");
  calibrate_cmd->add_option("--json", calibrate.json,
                            "write the result as JSON to FILE, or - for stdout");
  calibrate_cmd->add_option("--deadline", calibrate.deadline_seconds, "seconds per worker request")
    ->check(CLI::PositiveNumber);

  maxkernel::cli::model_options model;
  auto* model_cmd = app.add_subcommand(
    "model", "the kernel's and the reference's modeled time and profile on several chips");
  model_cmd->add_option("SPEC", model.spec,
                        "task: a native .yaml spec, a JAXBench or a MaxKernel task directory")
    ->required();
  model_cmd->add_option("KERNEL", model.kernel, "kernel file defining workload(*inputs)")
    ->required();
  model_cmd->add_option("--chip", model.chips, "chips, comma-separated (default: the spec's)")
    ->delimiter(',')
    ->check(CLI::IsMember(chips));
  model_cmd->add_option("--json", model.json, "write the result as JSON to FILE, or - for stdout");
  model_cmd->add_option("--state-dir", model.state_dir, "where the evaluation store lives");
  model_cmd->add_flag("--no-store", model.no_store,
                      "neither answer from nor record in the evaluation store");
  model_cmd->add_option("--simulate-device-ms", model.simulate_device_ms,
                        "model backend: simulated device time per evaluation");
  model_cmd->add_option("--deadline", model.deadline_seconds, "seconds per evaluation")
    ->check(CLI::PositiveNumber);

  maxkernel::cli::propose_options propose;
  auto* propose_cmd = app.add_subcommand(
    "propose", "the agent pool's first answer: plan, implement, repair and test a first kernel");
  propose_cmd->add_option("SPEC", propose.spec,
                          "task: a native .yaml spec, a JAXBench or a MaxKernel task directory")
    ->required();
  propose_cmd->add_option("--chip", propose.chip, "target chip (wins over the spec's)")
    ->check(CLI::IsMember(chips));
  propose_cmd->add_option("--out", propose.out, "write DIR/kernel.py and DIR/result.json");
  propose_cmd->add_option("--json", propose.json, "write the result as JSON to FILE, or - for stdout");
  propose_cmd->add_option("--brains", propose.brains,
                          "brain config YAML (docs/brains.md; default: every role expert)");
  propose_cmd->add_option("--state-dir", propose.state_dir, "where the evaluation store lives");
  propose_cmd->add_flag("--no-store", propose.no_store,
                        "neither answer from nor record in the evaluation store");
  propose_cmd->add_option("--max-repairs", propose.max_repairs, "debugger attempts per candidate lineage")
    ->check(CLI::Range(0u, 20u));
  propose_cmd->add_option("--max-steps", propose.max_steps, "plan steps (first candidates) to try")
    ->check(CLI::Range(1u, 20u));
  propose_cmd->add_option("--seed", propose.seed, "seed of the brains and of the tester's cases");
  propose_cmd->add_option("--deadline", propose.deadline_seconds, "seconds per evaluation")
    ->check(CLI::PositiveNumber);

  maxkernel::cli::optimize_options opt;
  auto* optimize_cmd = app.add_subcommand(
    "optimize", "search for the fastest correct kernel (auto: one trajectory; graph: a search "
                "graph fanned out over every node; hitl: auto's steps, each decided by an "
                "operator attached with `maxkernel attach`)");
  optimize_cmd->add_option("SPEC", opt.spec,
                           "task: a native .yaml spec, a JAXBench or a MaxKernel task directory")
    ->required();
  optimize_cmd->add_option("--mode", opt.mode, "auto | graph | hitl (default auto)")
    ->check(CLI::IsMember({"auto", "graph", "hitl"}));
  optimize_cmd->add_option("--operator-endpoint", opt.operator_endpoint,
                           "hitl: where operator shells attach (default tcp://127.0.0.1:*, any "
                           "free port; or ipc:///path)");
  optimize_cmd->add_option("--operator-timeout", opt.operator_timeout,
                           "hitl: seconds a proposal waits for a decision (0: forever)")
    ->check(CLI::NonNegativeNumber);
  optimize_cmd->add_flag("--console", opt.console,
                         "hitl: this terminal is an operator too (proposals on stdout, one "
                         "decision per line on stdin, as `maxkernel attach`)");
  optimize_cmd->add_option("--on-timeout", opt.on_timeout,
                           "hitl: what a timeout decides: wait | approve | stop (default wait)")
    ->check(CLI::IsMember({"wait", "approve", "stop"}));
  optimize_cmd->add_option("--out", opt.out,
                           "write DIR/kernel.py, result.json, search.sqlite, graph.json, "
                           "graph.dot and report.html");
  optimize_cmd->add_option("--json", opt.json, "write the result as JSON to FILE, or - for stdout");
  add_search_options(optimize_cmd, opt, chips);

  maxkernel::cli::bench_options bench;
  bench.search.budget_evals = 16;
  auto* bench_cmd = app.add_subcommand(
    "bench", "run a suite of tasks (native specs, JAXBench and MaxKernel task directories) "
             "through the search, several at once, and report the suite's figures "
             "(docs/bench.md)");
  bench_cmd->add_option("SUITE", bench.suite,
                        "a directory of tasks (searched recursively), or one task")
    ->required();
  auto* bench_mode = bench_cmd->add_option("--mode", bench.modes, "auto | graph | hitl-hint (default graph)")
    ->check(CLI::IsMember({"auto", "graph", "hitl-hint"}));
  bench_cmd->add_option("--modes", bench.modes,
                        "compare modes at equal budgets: a comma-separated list of auto, graph, "
                        "hitl-hint (each on its own evaluation store)")
    ->excludes(bench_mode);
  bench_cmd->add_option("--tasks", bench.tasks,
                        "only the tasks whose name or suite-relative path matches one of these "
                        "comma-separated globs");
  bench_cmd->add_option("--jobs", bench.jobs, "tasks searched at once (default: two per worker)")
    ->check(CLI::Range(1u, 256u));
  bench_cmd->add_option("--json", bench.json, "write the figures as JSON to FILE, or - for stdout");
  bench_cmd->add_option("--html", bench.html, "write the report page to FILE");
  bench_cmd->add_option("--out", bench.out,
                        "write each task's kernel.py, result.json and report to DIR/MODE/TASK/");
  add_search_options(bench_cmd, bench.search, chips);
  for (auto* o : bench_cmd->get_options())
    if (o->get_name() == "--budget-evals")
      o->description("candidates to evaluate per task (default 16; 0: no cap)");

  maxkernel::cli::template_options tmpl;
  auto* template_cmd = app.add_subcommand(
    "template", "which expert templates match a task's reference, and the kernel one renders");
  template_cmd->add_option("SPEC", tmpl.spec,
                           "task: a native .yaml spec, a JAXBench or a MaxKernel task directory")
    ->required();
  template_cmd->add_option("--name", tmpl.name, "the template to render (default: the best match)");
  template_cmd->add_option("--params", tmpl.params, "JSON object over the initial parameters");
  template_cmd->add_option("--chip", tmpl.chip, "target chip (wins over the spec's)")
    ->check(CLI::IsMember(chips));
  template_cmd->add_option("--out", tmpl.out, "write the rendered kernel to FILE");
  template_cmd->add_option("--children-dir", tmpl.children_dir,
                           "write the strategy playbook's children of the kernel to DIR");
  template_cmd->add_option("--children", tmpl.children, "how many children (default 3)")
    ->check(CLI::Range(1u, 100u));
  template_cmd->add_option("--json", tmpl.json, "write the matches as JSON to FILE, or - for stdout");
  template_cmd->add_option("--state-dir", tmpl.state_dir, "where the evaluation store lives");

  maxkernel::cli::console_options attach;
  auto* attach_cmd = app.add_subcommand(
    "attach", "attach this terminal to a hitl search's operator gateway and decide its proposals "
              "(one line of input per proposal: a script on stdin works too)");
  attach_cmd->add_option("ENDPOINT", attach.endpoint,
                         "the gateway's endpoint, as optimize --mode hitl prints it "
                         "(tcp://HOST:PORT or ipc:///path)")
    ->required();
  attach_cmd->add_option("--name", attach.name, "your operator name (default $USER)");
  attach_cmd->add_option("--connect-timeout", attach.connect_timeout_seconds,
                         "seconds to wait for the gateway's welcome (default 10)")
    ->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Usage errors are bad input: exit code 2 (help and version exit 0).
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (*check_cmd && (check.kernel.empty() ? 0 : 1) + (check.baseline ? 1 : 0)
                         + (check.reference_only ? 1 : 0)
                       != 1) {
    std::cerr << "check: give exactly one of KERNEL, --baseline or --reference-only\n";
    return 2;
  }
  try {
    if (*check_cmd)
      return maxkernel::cli::run_check(check);
    if (*spec_cmd)
      return maxkernel::cli::run_spec(spec);
    if (*model_cmd)
      return maxkernel::cli::run_model(model);
    if (*template_cmd)
      return maxkernel::cli::run_template(tmpl);
    if (*propose_cmd)
      return maxkernel::cli::run_propose(propose);
    if (*optimize_cmd)
      return maxkernel::cli::run_optimize(opt);
    if (*bench_cmd)
      return maxkernel::cli::run_bench(bench);
    if (*calibrate_cmd)
      return maxkernel::cli::run_calibrate(calibrate);
    if (*attach_cmd)
      return maxkernel::cli::run_attach(attach);
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 3;
  }
  return 2;
}
