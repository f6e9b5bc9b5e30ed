// What `maxkernel optimize` writes from a search's OptimizeResult: result.json (ARCHITECTURE.md,
// "Contracts"), kernel.py (the best kernel with its header comment, or the reference when
// nothing correct was found), graph.json and graph.dot (search/graph_export), and report.html
// (the best-speedup-versus-evaluations curve, the search graph and the best kernel's profile
// as inline SVG and tables, hitl's transcript: viewable offline). Each file is written whole or not at all.
#pragma once

#include "maxkernel/schema/kernel_spec.capnp.h"
#include "maxkernel/schema/search.capnp.h"

#include <nlohmann/json.hpp>

#include <string>

namespace maxkernel::cli {

// What the command knows besides the result.
struct optimize_outcome {
  std::string mode, chip, backend, jax_version;
  uint64_t seed = 0;
  double reference_us = 0, baseline_us = 0;
  unsigned extra_evaluations = 0, extra_cache_hits = 0;  // the reference's and baseline's
  double wall_seconds = 0;
  unsigned nodes = 1;
};

nlohmann::json result_json(schema::KernelSpec::Reader spec, schema::OptimizeResult::Reader result,
                           const optimize_outcome& outcome);
// One readable line: the best kernel and speedup (or the fallback), evaluations, stop reason.
std::string summary_line(schema::KernelSpec::Reader spec, schema::OptimizeResult::Reader result,
                         const optimize_outcome& outcome);
// kernel.py, result.json, graph.json, graph.dot, report.html into `dir`; and for hitl
// transcript.jsonl (each TranscriptEntry in Cap'n Proto's JSON, one per line).
std::string transcript_jsonl(schema::OptimizeResult::Reader result);
bool write_optimize_outputs(const std::string& dir, schema::KernelSpec::Reader spec,
                            schema::OptimizeResult::Reader result, const optimize_outcome& outcome,
                            const nlohmann::json& result_json, std::string& error);
// The best-speedup-versus-evaluations curve as an SVG (the curve of best times per candidate).
std::string speedup_curve_svg(schema::OptimizeResult::Reader result, double reference_us);

}  // namespace maxkernel::cli
