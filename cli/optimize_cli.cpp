#include "cli/optimize_cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>

namespace maxkernel::cli {

void add_search_options(CLI::App* cmd, optimize_options& opt, const std::vector<std::string>& chips) {
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
  cmd->add_flag("--no-dive", opt.no_dive,
                "graph: expand the frontier every round (by default a round that found a "
                "faster kernel is followed by one child of it, the planner's first move)");
  cmd->add_option("--max-repairs", opt.max_repairs, "debugger attempts per lineage")
    ->check(CLI::Range(0u, 20u));
  cmd->add_flag("--test-every-candidate", opt.test_every_candidate,
                "run the tester's cases for every candidate that passes the node's test (by "
                "default only for one faster than the best when its step started: the "
                "others cannot become the result)");
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
  cmd->add_option("--store-scope", opt.store_scope,
                  "answer from the evaluation store only what was stored under this scope "
                  "(letters, digits, . _ - /; default: the shared results), e.g. to compare "
                  "costs against a store that has seen none of them");
  cmd->add_option("--deadline", opt.deadline_seconds, "seconds per evaluation")
    ->check(CLI::PositiveNumber);
  cmd->add_option("--simulate-device-ms", opt.simulate_device_ms,
                  "model backend: simulated device time per evaluation");
  cmd->add_option("--memory-limit", opt.memory_limit_bytes,
                  "bytes the task's inputs may take")
    ->check(CLI::PositiveNumber);
}

void add_optimize_options(CLI::App* optimize_cmd, optimize_options& opt,
                          const std::vector<std::string>& chips) {
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
}

std::vector<std::string> submitted_args(const CLI::App& optimize_cmd, int argc,
                                        const char* const* argv, const std::string& spec) {
  static const std::vector<std::string> local{"--out", "--json", "--cluster", "--token-file"};
  std::vector<std::string> args;
  int i = 1;
  while (i < argc && std::string(argv[i]) != optimize_cmd.get_name())
    ++i;
  bool spec_seen = false;
  for (++i; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
      auto eq = arg.find('=');
      auto name = arg.substr(0, eq);
      const auto* option = optimize_cmd.get_option_no_throw(name);
      bool takes_value = eq == std::string::npos && option && option->get_type_size() != 0;
      bool keep = std::find(local.begin(), local.end(), name) == local.end();
      if (keep)
        args.push_back(arg);
      if (takes_value && i + 1 < argc) {
        ++i;
        if (keep)
          args.emplace_back(argv[i]);
      }
    } else if (!spec_seen && arg == spec) {
      spec_seen = true;
    } else {
      args.push_back(arg);
    }
  }
  return args;
}

}  // namespace maxkernel::cli
