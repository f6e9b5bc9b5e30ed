#include "cli/optimize_outputs.hpp"

#include "cli/jaxbench_export.hpp"
#include "cli/output_file.hpp"
#include "cli/profile_report.hpp"
#include "cli/svg_chart.hpp"
#include "maxkernel/schema/operator.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/decision_kind.hpp"
#include "messages/version.hpp"
#include "search/graph_export.hpp"

#include <capnp/compat/json.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <vector>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The best vertex when it beats the reference (or the reference is unknown); -1 otherwise.
struct best_choice {
  int vertex = -1;        // the best correct vertex, -1 when none
  bool beats = false;     // it is faster than the reference
  double time_us = 0;
  double roofline_us = 0;
  std::string timing = "modeled";
};

best_choice choose(schema::OptimizeResult::Reader result, double reference_us) {
  best_choice b;
  b.vertex = result.getBest();
  if (b.vertex < 0 || static_cast<unsigned>(b.vertex) >= result.getVertices().size()) {
    b.vertex = -1;
    return b;
  }
  auto v = result.getVertices()[static_cast<unsigned>(b.vertex)];
  b.time_us = v.getTimeUs();
  b.roofline_us = v.getRooflineUs();
  if (v.getResult().getHasProfile() &&
      v.getResult().getProfile().getTiming() == schema::Timing::MEASURED)
    b.timing = "measured";
  b.beats = b.time_us > 0 && (reference_us <= 0 || b.time_us < reference_us);
  return b;
}

// The task's roofline time: the best kernel's, else any profiled vertex's (the roofline of a
// task does not depend on the kernel); 0 when none was profiled.
double task_roofline_us(schema::OptimizeResult::Reader result, const best_choice& b) {
  if (b.roofline_us > 0)
    return b.roofline_us;
  for (auto v : result.getVertices())
    if (v.getRooflineUs() > 0)
      return v.getRooflineUs();
  return 0;
}

std::string params_text(schema::Candidate::Reader c) {
  json p = json::object();
  for (auto x : c.getParams())
    p[x.getName().cStr()] = json::parse(x.getValue().cStr(), nullptr, false);
  return p.dump();
}

std::vector<std::string> vertex_bytes(schema::OptimizeResult::Reader result) {
  std::vector<std::string> out;
  for (auto v : result.getVertices())
    out.push_back(messages::encode_root(v));
  return out;
}

// The module in the JAXBench convention (cli/jaxbench_export), or `module` as it is with a
// header line saying why not: the export never fails the command.
std::string in_jaxbench_convention(schema::KernelSpec::Reader spec, const std::string& module) {
  std::string exported, error;
  if (export_jaxbench_kernel(spec, module, exported, error))
    return exported;
  std::replace(error.begin(), error.end(), '\n', ' ');
  return fmt::format("# not in the JAXBench convention: {}\n", error) + module;
}

std::string kernel_file(schema::KernelSpec::Reader spec, schema::OptimizeResult::Reader result,
                        const optimize_outcome& o, const best_choice& b) {
  if (b.vertex >= 0 && b.beats) {
    auto v = result.getVertices()[static_cast<unsigned>(b.vertex)];
    auto c = v.getCandidate();
    double speedup = o.reference_us > 0 ? o.reference_us / b.time_us : 0;
    return fmt::format(
             "# maxkernel optimize ({} mode): task {}, chip {}\n# {} {}\n# strategy: {}\n"
             "# time {:.2f} us ({}), reference {:.2f} us, speedup {:.2f}x; vertex {} of {} "
             "evaluated\n# JAX {}, maxkernel {}\n",
             o.mode, spec.getName().cStr(), o.chip,
             c.getTemplate().size() ? c.getTemplate().cStr() : c.getOrigin().cStr(),
             params_text(c), v.getStrategy().cStr(), b.time_us, b.timing, o.reference_us,
             speedup, b.vertex, result.getCandidatesEvaluated(), o.jax_version,
             messages::maxkernel_version()) +
           in_jaxbench_convention(spec, c.getSource().cStr());
  }
  std::string why = b.vertex < 0 ? "no correct kernel was found"
                                 : fmt::format("the best correct kernel ({:.2f} us) does not beat "
                                               "the reference ({:.2f} us)",
                                               b.time_us, o.reference_us);
  std::string text = fmt::format("# maxkernel optimize ({} mode): task {}, chip {}: {}; this is "
                                 "the reference (fallback)\n# JAX {}, maxkernel {}\n",
                                 o.mode, spec.getName().cStr(), o.chip, why, o.jax_version,
                                 messages::maxkernel_version());
  // The reference as the kernel: workload is the reference's entry function.
  std::string reference = spec.getReference().cStr();
  std::string entry = spec.getReferenceEntry().cStr();
  if (!entry.empty() && entry != "workload")
    reference += fmt::format("\n\nworkload = {}\n", entry);
  return text + in_jaxbench_convention(spec, reference);
}

// One readable line per transcript entry (the report's transcript section).
std::vector<std::string> transcript_lines(schema::OptimizeResult::Reader result) {
  std::vector<std::string> lines;
  for (auto bytes : result.getTranscript()) {
    std::string error;
    auto e = messages::decode<schema::TranscriptEntry>(
      std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()), error);
    if (!e) {
      lines.push_back("(unreadable entry: " + error + ")");
      continue;
    }
    auto t = e->root<schema::TranscriptEntry>();
    switch (t.which()) {
      case schema::TranscriptEntry::PROPOSAL: {
        auto v = t.getProposal().getVertex();
        lines.push_back(fmt::format(
          "#{} proposal: vertex {} ({}) {}{}", t.getSeq(), v.getIndex(), v.getStrategy().cStr(),
          v.getCorrect() ? "correct" : v.getFailureClass().cStr(),
          v.getTimeUs() > 0 ? fmt::format(", {:.2f} us", v.getTimeUs()) : ""));
        break;
      }
      case schema::TranscriptEntry::DECISION: {
        auto d = t.getDecision();
        std::string detail = d.getText().cStr();
        if (d.getKind() == schema::DecisionKind::HAND_OVER)
          detail = fmt::format("{} steps", d.getSteps());
        else if (d.getKind() == schema::DecisionKind::EDIT && d.getChanges().size()) {
          detail.clear();
          for (auto c : d.getChanges())
            detail += fmt::format("{}{}={}", detail.empty() ? "" : " ", c.getName().cStr(),
                                  c.getValue().cStr());
        } else if (d.getSource().size())
          detail = fmt::format("a kernel of {} lines", std::count(d.getSource().begin(),
                                                                 d.getSource().end(), '\n'));
        lines.push_back(fmt::format("#{} {} by {}{}", t.getSeq(), messages::decision_kind_name(d.getKind()),
                                    d.getOperator().size() ? d.getOperator().cStr() : "?",
                                    detail.empty() ? "" : ": " + detail));
        break;
      }
      case schema::TranscriptEntry::NOTE:
        lines.push_back(fmt::format("#{} {}", t.getSeq(), t.getNote().cStr()));
        break;
    }
  }
  return lines;
}

std::string report_html(schema::KernelSpec::Reader spec, schema::OptimizeResult::Reader result,
                        const optimize_outcome& o, const json& summary, const best_choice& b,
                        const std::string& dot) {
  std::string svg, svg_error;
  std::string graph_part = search::dot_to_svg(dot, svg, svg_error)
                             ? svg.substr(std::min(svg.find("<svg"), svg.size()))
                             : fmt::format("<p>{} (graph.dot holds the graph)</p>",
                                           html_escape(svg_error));
  std::string profile_part = "<p>No correct kernel: no profile.</p>";
  if (b.vertex >= 0) {
    auto r = result.getVertices()[static_cast<unsigned>(b.vertex)].getResult();
    if (r.getHasProfile()) {
      std::string rows;
      for (auto c : r.getProfile().getCalls())
        rows += fmt::format(
          "<tr><td>{}</td><td>{:.2f}</td><td>{}</td><td>{:.2f}</td><td>{:.2f}</td><td>{:.2f}</td>"
          "<td>{:.0f}%</td><td>{:.0f}</td></tr>\n",
          html_escape(c.getName().cStr()), c.getTimeUs(), html_escape(c.getBound().cStr()),
          c.getComputeUs(), c.getMemoryUs(), c.getOverheadUs(), 100 * c.getMxuUtilization(),
          c.getSteps());
      profile_part = fmt::format(
        "<table><tr><th>call</th><th>time us</th><th>bound</th><th>compute us</th>"
        "<th>memory us</th><th>overhead us</th><th>MXU</th><th>grid steps</th></tr>\n{}"
        "</table>\n<pre>{}</pre>",
        rows, html_escape(profile_summary(r.getProfile(), "")));
    }
  }
  std::string vertices;
  for (auto v : result.getVertices()) {
    double speedup = v.getCorrect() && v.getTimeUs() > 0 && o.reference_us > 0
                       ? o.reference_us / v.getTimeUs()
                       : 0;
    std::string outcome = v.getCorrect() ? "correct" : v.getFailureClass().cStr();
    if (v.getDecision().size())
      outcome += fmt::format(" ({})", v.getDecision().cStr());
    vertices += fmt::format(
      "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
      v.getIndex(), v.getParent(), html_escape(v.getStrategy().cStr()), html_escape(outcome),
      v.getTimeUs() > 0 ? fmt::format("{:.2f}", v.getTimeUs()) : "",
      speedup > 0 ? fmt::format("{:.2f}x", speedup) : "", html_escape(v.getVerdict().cStr()));
  }
  std::string transcript;
  for (const auto& line : transcript_lines(result))
    transcript += html_escape(line) + "\n";
  if (!transcript.empty())
    transcript = "<h2>Operator transcript</h2>\n<pre>" + transcript + "</pre>\n";
  return fmt::format(
    "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>maxkernel: {task}</title>\n"
    "<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}"
    "td,th{{border:1px solid #ccc;padding:2px 6px;font-size:13px}}pre{{background:#f6f6f6;"
    "padding:8px}}</style></head><body>\n"
    "<h1>{task}</h1>\n<p>{mode} search on {chip} ({timing}, {backend} backend): {line}</p>\n"
    "<h2>Best speedup versus candidates evaluated</h2>\n{curve}\n"
    "<h2>Search graph</h2>\n{graph}\n<h2>Profile of the best kernel ({timing})</h2>\n{profile}\n"
    "<h2>Vertices</h2>\n<table><tr><th>vertex</th><th>parent</th><th>strategy</th><th>outcome</th>"
    "<th>time us</th><th>speedup</th><th>tests</th></tr>\n{vertices}</table>\n{transcript}"
    "<h2>result.json</h2>\n<pre>{json}</pre>\n</body></html>\n",
    fmt::arg("task", html_escape(spec.getName().cStr())), fmt::arg("mode", o.mode),
    fmt::arg("chip", o.chip), fmt::arg("timing", b.timing), fmt::arg("backend", o.backend),
    fmt::arg("line", html_escape(summary_line(spec, result, o))),
    fmt::arg("curve", speedup_curve_svg(result, o.reference_us)), fmt::arg("graph", graph_part),
    fmt::arg("profile", profile_part), fmt::arg("vertices", vertices),
    fmt::arg("transcript", transcript),
    fmt::arg("json", html_escape(summary.dump(2))));
}

}  // namespace

namespace {

// The worker's default warm-up (3) and timed (10) runs: what one timed evaluation costs the
// device, in multiples of the kernel's time.
constexpr unsigned timing_runs = 13;

// What the search cost: whether any candidate lowered, the worker's phase seconds, the
// device seconds of its timing runs (modeled or measured, as the timing field says), and the
// best kernel's profile.
void add_search_cost(json& j, schema::OptimizeResult::Reader result, int best_vertex) {
  auto vertices = result.getVertices();
  bool compiled = false;
  double worker = 0, device = 0;
  for (auto v : vertices) {
    if (!v.getHasResult())
      continue;
    for (auto p : v.getResult().getPhases()) {
      worker += p.getSeconds();
      compiled |= p.getPhase() == schema::Phase::LOWER && p.getStatus() == schema::Status::OK;
    }
    device += v.getTimeUs() * timing_runs / 1e6;
  }
  j["compiled"] = compiled;
  j["worker_seconds"] = worker;
  j["device_seconds"] = device;
  j["profile"] = nullptr;
  if (best_vertex >= 0 && static_cast<unsigned>(best_vertex) < vertices.size()) {
    auto r = vertices[static_cast<unsigned>(best_vertex)].getResult();
    if (r.getHasProfile())
      j["profile"] = profile_json(r.getProfile());
  }
}

}  // namespace

json result_json(schema::KernelSpec::Reader spec, schema::OptimizeResult::Reader result,
                 const optimize_outcome& o) {
  auto b = choose(result, o.reference_us);
  bool correct = b.vertex >= 0;
  bool fallback = !b.beats;
  double kernel_us = fallback ? o.reference_us : b.time_us;
  double roofline_us = task_roofline_us(result, b);
  auto nullable = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  json failures = json::object();
  for (auto f : result.getFailures())
    failures[f.getFailureClass().cStr()] = f.getCount();
  auto usage = result.getUsage();
  json j = {
    {"schema", 1},
    {"task", spec.getName().cStr()},
    {"mode", o.mode},
    {"chip", o.chip},
    {"backend", o.backend},
    {"timing", b.timing},
    {"correct", correct},
    {"fallback_to_reference", fallback},
    {"kernel_time_us", nullable(kernel_us)},
    {"reference_time_us", nullable(o.reference_us)},
    {"baseline_time_us", nullable(o.baseline_us)},
    {"speedup_vs_reference",
     !fallback && o.reference_us > 0 ? o.reference_us / kernel_us : 1.0},
    {"speedup_vs_baseline",
     o.baseline_us > 0 && kernel_us > 0 ? json(o.baseline_us / kernel_us) : json(nullptr)},
    {"roofline_time_us", nullable(roofline_us)},
    {"roofline_fraction",
     roofline_us > 0 && kernel_us > 0 ? json(roofline_us / kernel_us) : json(nullptr)},
    {"evaluations", result.getEvaluations() + o.extra_evaluations},
    {"cache_hits", result.getCacheHits() + o.extra_cache_hits},
    {"failures", failures},
    {"wall_seconds", o.wall_seconds},
    {"tokens", {{"prompt", usage.getPromptTokens()}, {"completion", usage.getCompletionTokens()}}},
    {"cost_usd", usage.getHasCost() ? json(usage.getCostUsd()) : json(nullptr)},
    {"seed", o.seed},
    {"jax_version", o.jax_version},
    {"maxkernel_version", messages::maxkernel_version()},
    {"candidates_evaluated", result.getCandidatesEvaluated()},
    {"rounds", result.getRounds()},
    {"stop_reason", result.getStopReason().cStr()},
    {"resumed", result.getResumed()},
    {"nodes", o.nodes},
  };
  if (correct) {
    auto v = result.getVertices()[static_cast<unsigned>(b.vertex)];
    auto c = v.getCandidate();
    j["best_candidate"] = {{"vertex", b.vertex}, {"id", c.getId().cStr()},
                           {"template", c.getTemplate().cStr()},
                           {"params", json::parse(params_text(c))},
                           {"strategy", v.getStrategy().cStr()}, {"time_us", b.time_us},
                           {"tests", v.getVerdict().cStr()}};
    if (v.getHasDiagnosis()) {
      auto d = v.getDiagnosis();
      json suggestions = json::array();
      for (auto s : d.getSuggestions())
        suggestions.push_back(s.getRationale().cStr());
      j["diagnosis"] = {{"bound", d.getBound().cStr()}, {"headroom", d.getHeadroom()},
                        {"bottleneck", d.getBottleneckCallName().cStr()},
                        {"suggestions", suggestions}};
    }
  }
  json curve = json::array();
  for (double t : result.getBestPerEvaluation())
    curve.push_back(t > 0 && o.reference_us > 0 ? json(o.reference_us / t) : json(nullptr));
  j["best_speedup_per_candidate"] = curve;
  add_search_cost(j, result, b.vertex);
  return j;
}

std::string summary_line(schema::KernelSpec::Reader spec, schema::OptimizeResult::Reader result,
                         const optimize_outcome& o) {
  auto b = choose(result, o.reference_us);
  std::string what =
    b.vertex < 0 ? "no correct kernel (fallback to the reference)"
    : !b.beats   ? fmt::format("best correct kernel {:.2f} us does not beat the reference "
                                 "(fallback to the reference)",
                               b.time_us)
                 : fmt::format("best kernel {:.2f} us ({}), speedup {:.2f}x", b.time_us, b.timing,
                               o.reference_us > 0 ? o.reference_us / b.time_us : 0.0);
  return fmt::format("{}: {}; reference {:.2f} us; {} candidates, {} evaluations, stopped on {}, "
                     "{:.1f} s\n",
                     spec.getName().cStr(), what, o.reference_us, result.getCandidatesEvaluated(),
                     result.getEvaluations(), result.getStopReason().cStr(), o.wall_seconds);
}

std::string speedup_curve_svg(schema::OptimizeResult::Reader result, double reference_us) {
  auto curve = result.getBestPerEvaluation();
  const double w = 640, h = 240, left = 50, bottom = 30, top = 10, right = 10;
  double max_speedup = 1.0;
  for (double t : curve)
    if (t > 0 && reference_us > 0)
      max_speedup = std::max(max_speedup, reference_us / t);
  max_speedup *= 1.1;
  size_t n = std::max<size_t>(curve.size(), 1);
  auto x = [&](double i) { return left + (w - left - right) * i / static_cast<double>(n); };
  auto y = [&](double s) { return h - bottom - (h - bottom - top) * s / max_speedup; };
  std::string path;
  for (unsigned i = 0; i < curve.size(); ++i) {
    double t = curve[i];
    if (t <= 0 || reference_us <= 0)
      continue;
    double s = reference_us / t;
    path += fmt::format("{}{:.1f},{:.1f} L{:.1f},{:.1f} ", path.empty() ? "M" : "L", x(i), y(s),
                        x(i + 1), y(s));
  }
  std::string svg = fmt::format(
    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\">\n"
    "<line x1=\"{l}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n"
    "<line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{b}\" stroke=\"black\"/>\n"
    "<line x1=\"{l}\" y1=\"{one:.1f}\" x2=\"{r}\" y2=\"{one:.1f}\" stroke=\"#999\" "
    "stroke-dasharray=\"4 3\"/>\n"
    "<text x=\"{l}\" y=\"{hb}\" font-size=\"11\">candidates evaluated: {n}</text>\n"
    "<text x=\"2\" y=\"{one:.1f}\" font-size=\"11\">1.0x</text>\n"
    "<text x=\"2\" y=\"{ty}\" font-size=\"11\">{top:.2f}x</text>\n",
    fmt::arg("w", w), fmt::arg("h", h), fmt::arg("l", left), fmt::arg("r", w - right),
    fmt::arg("b", h - bottom), fmt::arg("t", top), fmt::arg("one", y(1.0)),
    fmt::arg("hb", h - 8), fmt::arg("n", curve.size()), fmt::arg("ty", top + 10),
    fmt::arg("top", max_speedup));
  if (!path.empty())
    svg += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"#1565c0\" stroke-width=\"2\"/>\n",
                       path);
  return svg + "</svg>";
}

std::string transcript_jsonl(schema::OptimizeResult::Reader result) {
  capnp::JsonCodec codec;
  std::string out;
  for (auto bytes : result.getTranscript()) {
    std::string error;
    auto e = messages::decode<schema::TranscriptEntry>(
      std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()), error);
    out += e ? std::string(codec.encode(e->root<schema::TranscriptEntry>()).cStr())
             : json{{"error", error}}.dump();
    out += "\n";
  }
  return out;
}

bool write_optimize_outputs(const std::string& dir, schema::KernelSpec::Reader spec,
                            schema::OptimizeResult::Reader result, const optimize_outcome& o,
                            const json& summary, std::string& error) {
  auto b = choose(result, o.reference_us);
  auto bytes = vertex_bytes(result);
  // One DOT text for graph.dot and the report's SVG.
  std::string dot = search::graph_dot(bytes, o.reference_us, result.getBest());
  auto path = [&](const char* name) { return (fs::path(dir) / name).string(); };
  return write_output(path("kernel.py"), kernel_file(spec, result, o, b), error) &&
         write_output(path("result.json"), summary.dump(2) + "\n", error) &&
         write_output(path("graph.json"), search::graph_json(bytes, o.reference_us), error) &&
         write_output(path("graph.dot"), dot, error) &&
         write_output(path("report.html"), report_html(spec, result, o, summary, b, dot), error) &&
         (result.getTranscript().size() == 0 ||
          write_output(path("transcript.jsonl"), transcript_jsonl(result), error));
}

}  // namespace maxkernel::cli
