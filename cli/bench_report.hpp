// The HTML report of `maxkernel bench --html`: a pure function of the bench JSON (docs of its
// shape: one RUN from --mode, or {"modes": [RUN...], "comparison": ...} from --modes).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace maxkernel::cli {

// One self-contained HTML page (inline SVG and tables; no scripts, no external resources:
// viewable offline): a summary table per mode, per-task speedup bars against the reference
// and the baseline (log axis, failed tasks marked as failures), the geomean best speedup
// versus candidates evaluated per mode, the mode comparison and its rule, profile breakdowns
// of the best kernels, failures by class, and a per-task table with each failed task's
// error. Every time is labelled with the JSON's timing (modeled | measured); all text from
// the JSON is escaped. Never throws: missing or null fields show as "n/a", an input that is
// not a bench JSON or has no tasks yields a page that says so.
std::string bench_report_html(const nlohmann::json& bench);

}  // namespace maxkernel::cli
