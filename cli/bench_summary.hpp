// The figures of a benchmark run (docs/bench.md): per-task rows aggregated into the suite's
// rates and geometric means (KernelBench's fast_p), per kernel family, and the comparison of
// modes with the mode-choice rule that follows from it. Pure functions over the bench JSON
// (the shape in docs/bench.md), so the figures are tested without running a search.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace maxkernel::cli {

// The kind of kernel a template writes ("matmul", "attention", "moe", "rowwise", "conv",
// "recurrence", ...); "unmatched" for none. Families group a suite's figures.
std::string kernel_family(const std::string& template_name);

// `run` holds the run's header fields (mode, chip, ...); adds `tasks` and every aggregate:
// tasks_total, compile_rate, correct_rate, fast_1, fast_1_5, fast_2 (shares of all tasks that
// are correct and faster than the reference by more than p), geomean speedups (a task without
// a correct kernel counts 1.0 against the reference: its result is the reference), baseline
// parity, mean roofline fraction, sums of evaluations, cache hits, failures, seconds, tokens,
// cost, and `families`.
nlohmann::json summarize_run(nlohmann::json run, std::vector<nlohmann::json> tasks);

// Rows of quality against cost per mode and family ("all" first), and the rule for choosing a
// mode stated from them: per family, the mode with the highest geomean speedup, unless a
// cheaper mode (fewer worker seconds) comes within `tolerance` of it.
nlohmann::json compare_modes(const std::vector<nlohmann::json>& runs, double tolerance = 0.02);

}  // namespace maxkernel::cli
