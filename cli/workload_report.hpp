// The figures of `maxkernel workload` (docs/workloads.md): the bench rows of a model's step
// tasks weighted by how often each runs per step. Pure over the bench JSON, so the step
// times are tested without a search.
#pragma once

#include "config/workload_expansion.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace maxkernel::cli {

// `run` is one mode's bench JSON (its rows under "tasks", matched to `tasks` by "relative",
// the task's name). Per task: occurrences, roles, dims, speedup, reference and best times,
// and its part of the step before (occurrences x reference time) and after (occurrences x
// the best correct kernel's time; the reference's where none beats it). The step times
// before and after are the sums, labelled by the run's `timing` (modeled | measured); tasks
// without a reference time are listed in `untimed_tasks` and left out of both sums.
nlohmann::json workload_report(const config::workload_config& model, config::workload_phase phase,
                               const std::vector<config::workload_task>& tasks,
                               const nlohmann::json& run);

// The readable table and the step times of a report.
std::string workload_summary(const nlohmann::json& report);

}  // namespace maxkernel::cli
