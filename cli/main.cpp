// The maxkernel program: parses the command line and runs one command.
#include "cli/bench_command.hpp"
#include "cli/calibrate_command.hpp"
#include "cli/check_command.hpp"
#include "cli/model_command.hpp"
#include "cli/operator_console.hpp"
#include "cli/cluster_client.hpp"
#include "cli/cluster_init_command.hpp"
#include "cli/node_command.hpp"
#include "cli/optimize_cli.hpp"
#include "cli/optimize_command.hpp"
#include "cli/supervisor_command.hpp"
#include "cli/propose_command.hpp"
#include "cli/shell_command.hpp"
#include "cli/template_command.hpp"
#include "cli/workload_cli.hpp"
#include "cli/spec_command.hpp"
#include "config/chip_names.hpp"
#include "messages/version.hpp"

#include <CLI/CLI.hpp>

#include <iostream>

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
  maxkernel::cli::add_optimize_options(optimize_cmd, opt, chips);
  maxkernel::cli::cluster_client_options cluster_client;
  optimize_cmd->add_option("--cluster", cluster_client.endpoint,
                           "submit to a running cluster: the supervisor's client port HOST:PORT "
                           "(docs/cluster.md); the outputs are written here as without it");
  optimize_cmd->add_option("--token-file", cluster_client.token_file,
                           "with --cluster: the cluster's credentials (cluster init DIR: DIR/token)");

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
  bench_cmd->add_option("--jobs", bench.jobs, "tasks searched at once (default: two per worker; with --cluster, all)")
    ->check(CLI::Range(1u, 256u));
  bench_cmd->add_option("--json", bench.json, "write the figures as JSON to FILE, or - for stdout");
  bench_cmd->add_option("--html", bench.html, "write the report page to FILE");
  bench_cmd->add_option("--out", bench.out,
                        "write each task's kernel.py, result.json and report to DIR/MODE/TASK/");
  bench_cmd->add_option("--cluster", bench.cluster,
                        "submit every task to a running cluster: the supervisor's client port "
                        "HOST:PORT (docs/cluster.md); the report is written here as without it");
  bench_cmd->add_option("--token-file", bench.token_file,
                        "with --cluster: the cluster's credentials (cluster init DIR: DIR/token)");
  maxkernel::cli::add_search_options(bench_cmd, bench.search, chips);
  for (auto* o : bench_cmd->get_options())
    if (o->get_name() == "--budget-evals")
      o->description("candidates to evaluate per task (default 16; 0: no cap)");

  maxkernel::cli::workload_options workload;
  auto* workload_cmd = maxkernel::cli::add_workload_command(app, workload, chips);

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
  maxkernel::cli::cluster_init_command cluster_init(app);
  maxkernel::cli::cluster_client_options status_client;
  status_client.silence_seconds = 10;
  auto* status_cmd = app.get_subcommand("cluster")->add_subcommand(
    "status", "what a running supervisor says of its nodes and work");
  status_cmd->add_option("--cluster", status_client.endpoint,
                         "the supervisor's client port HOST:PORT")
    ->required();
  status_cmd->add_option("--token-file", status_client.token_file,
                         "the cluster's credentials (cluster init DIR: DIR/token)");

  maxkernel::cli::supervisor_command_options supervisor;
  auto* supervisor_cmd = app.add_subcommand(
    "supervisor", "run a cluster's supervisor: the evaluation store, the dispatcher that node "
                  "processes join, and the client port where `optimize --cluster` submits "
                  "(docs/cluster.md)");
  supervisor_cmd->add_option("--config", supervisor.config, "cluster.yaml (the flags win over it)");
  supervisor_cmd->add_option("--listen", supervisor.listen,
                             "node port HOST:PORT (default 127.0.0.1:7400; port 0: any)");
  supervisor_cmd->add_option("--shell-listen", supervisor.shell_listen,
                             "client port HOST:PORT (default 127.0.0.1:7401; port 0: any)");
  supervisor_cmd->add_option("--state-dir", supervisor.state_dir,
                             "the evaluation store, search graphs and submitted tasks");
  supervisor_cmd->add_option("--token-file", supervisor.token_file,
                             "the cluster's credentials (cluster init DIR: DIR/token)");
  supervisor_cmd->add_option("--deadline", supervisor.deadline_seconds, "seconds per evaluation")
    ->check(CLI::PositiveNumber);
  supervisor_cmd->add_flag("--resume", supervisor.resume,
                           "run again the submissions a killed supervisor left unfinished, for "
                           "their clients (nothing that finished is evaluated again)");

  maxkernel::cli::node_command_options node;
  auto* node_cmd = app.add_subcommand(
    "node", "run one TPU host of a cluster: its devices join the supervisor and evaluate the "
            "candidates it dispatches (docs/cluster.md)");
  node_cmd->add_option("--config", node.config, "cluster.yaml (the flags win over it)");
  node_cmd->add_option("--join", node.join, "the supervisor's node port HOST:PORT");
  node_cmd->add_option("--token-file", node.token_file,
                       "the cluster's credentials (cluster init DIR: DIR/token)");
  node_cmd->add_option("--backend", node.backend, "model | jax-tpu (default: the config's, model)")
    ->check(CLI::IsMember({"model", "jax-tpu"}));
  node_cmd->add_option("--devices", node.devices, "TPU devices (simulated on the model backend)")
    ->check(CLI::Range(1u, 4096u));
  node_cmd->add_option("--chip", node.chip, "the devices' chip")->check(CLI::IsMember(chips));
  node_cmd->add_option("--workers", node.workers, "JAX workers (0: one per core)")
    ->check(CLI::Range(0, 1024));
  node_cmd->add_option("--simulate-device-ms", node.simulate_device_ms,
                       "model backend: simulated device time per evaluation");
  node_cmd->add_option("--state-dir", node.state_dir,
                       "a host-local evaluation store that answers repeats (default: none)");
  node_cmd->add_option("--retry", node.retry_seconds,
                       "seconds between attempts to join (default 1)")
    ->check(CLI::PositiveNumber);
  node_cmd->add_option("--deadline", node.deadline_seconds, "seconds per evaluation")
    ->check(CLI::PositiveNumber);

  maxkernel::cli::shell_options shell;
  auto* shell_cmd = app.add_subcommand(
    "shell", "the operator shell of a running cluster: its nodes and tasks, submit, export, "
             "drain, and hitl decisions (docs/cluster.md)");
  shell_cmd->add_option("--attach", shell.client.endpoint,
                        "the supervisor's client port HOST:PORT (default: the config's)");
  shell_cmd->add_option("--config", shell.config, "cluster.yaml (the flags win over it)");
  shell_cmd->add_option("--token-file", shell.client.token_file,
                        "the cluster's credentials (cluster init DIR: DIR/token)");
  shell_cmd->add_option("-c", shell.commands, "run these commands (separated by ';') and leave");
  shell_cmd->add_flag("--json", shell.json, "print what the supervisor says as JSON, a line each");

  auto* attach_cmd = app.add_subcommand(
    "attach", "attach this terminal to a hitl search's operator gateway and decide its proposals "
              "(one line of input per proposal: a script on stdin works too)");
  attach_cmd->add_option("ENDPOINT", attach.endpoint,
                         "the gateway's endpoint, as optimize --mode hitl prints it "
                         "(tcp://HOST:PORT or ipc:///path)")
    ->required();
  attach_cmd->add_option("--name", attach.name, "your operator name (default $USER)");
  attach_cmd->add_option("--token-file", attach.token_file,
                         "a cluster's credentials, for a gateway of a search submitted to a "
                         "cluster (cluster init DIR: DIR/token)");
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
    if (*optimize_cmd && !cluster_client.endpoint.empty())
      return maxkernel::cli::run_cluster_optimize(
        opt, maxkernel::cli::submitted_args(*optimize_cmd, argc, argv, opt.spec), cluster_client);
    if (*optimize_cmd)
      return maxkernel::cli::run_optimize(opt);
    if (cluster_init.selected())
      return cluster_init.run();
    if (*status_cmd)
      return maxkernel::cli::run_cluster_status(status_client);
    if (*shell_cmd)
      return maxkernel::cli::run_shell(shell);
    if (*supervisor_cmd)
      return maxkernel::cli::run_supervisor(supervisor);
    if (*node_cmd)
      return maxkernel::cli::run_node(node);
    if (*bench_cmd)
      return maxkernel::cli::run_bench(bench);
    if (*workload_cmd)
      return maxkernel::cli::run_workload(workload);
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
