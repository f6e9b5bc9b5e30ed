#include "cli/calibrate_command.hpp"

#include "messages/eval_request.hpp"
#include "cli/kernel_file.hpp"
#include "cli/measurements_csv.hpp"
#include "cli/output_file.hpp"
#include "cli/spec_source.hpp"
#include "config/chip_loader.hpp"
#include "messages/capnp_io.hpp"
#include "tpu_nodes/model/calibration.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/message.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace maxkernel::cli {

namespace fs = std::filesystem;

namespace {

// The traced structure (or reference graph) of one row, encoded; exit code on failure.
int trace_row(const measurement_row& row, tpu_nodes::worker_client& worker,
              std::chrono::milliseconds deadline, std::string& bytes, std::string& error) {
  std::string where = fmt::format("line {}", row.line);
  auto kind = classify_spec(row.spec, error);
  if (kind == spec_kind::invalid) {
    error = where + ": spec: " + error;
    return 2;
  }
  auto loaded = load_spec(row.spec, kind, row.chip, 8ull << 30, worker_task_loader(worker, 8ull << 30));
  if (loaded.exit_code != 0) {
    error = where + ": spec: " + loaded.error;
    return loaded.exit_code;
  }
  auto spec_msg = messages::decode<schema::KernelSpec>(loaded.spec_bytes, error);
  if (!spec_msg)
    return 3;
  auto spec = spec_msg->root<schema::KernelSpec>();
  if (row.kernel == "reference") {
    auto graph = worker.analyze(spec, 0, deadline);
    if (!graph.ok) {
      error = where + ": reference: " + graph.message;
      return graph.error_class == schema::ErrorClass::BAD_INPUT ? 2 : 3;
    }
    bytes = graph.bytes;
    return 0;
  }
  std::string source;
  if (!read_kernel(row.kernel, source, error)) {
    error = where + ": kernel: " + error;
    return 2;
  }
  capnp::MallocMessageBuilder msg;
  auto request = msg.initRoot<schema::EvalRequest>();
  messages::request_settings settings;
  settings.chip = row.chip;
  messages::build_eval_request(request, spec, source, row.kernel, settings);
  auto answer = worker.evaluate(tpu_nodes::eval_kind::extract, request.asReader(), deadline);
  if (!answer.ok) {
    error = where + ": kernel: " + answer.message;
    return 3;
  }
  auto result_msg = messages::decode<schema::EvalResult>(answer.bytes, error);
  if (!result_msg)
    return 3;
  auto result = result_msg->root<schema::EvalResult>();
  if (!result.getHasStructure()) {
    std::string why;
    for (auto p : result.getPhases())
      if (p.getStatus() == schema::Status::FAILED)
        why = p.getMessage().cStr();
    error = where + ": kernel " + row.kernel + " cannot be traced: " + why;
    return 2;
  }
  bytes = messages::encode_root(result.getStructure());
  return 0;
}

nlohmann::json errors_json(const tpu_nodes::model::calibration_errors& e) {
  return {{"median_error", e.median_error}, {"max_ratio", e.max_ratio}};
}

nlohmann::json efficiency_json(const config::chip_efficiency& e) {
  return {{"mxu", e.mxu},
          {"vpu", e.vpu},
          {"hbm", e.hbm},
          {"dma_latency_us", e.dma_latency_us},
          {"step_overhead_us", e.step_overhead_us},
          {"kernel_launch_us", e.kernel_launch_us},
          {"xla_mxu", e.xla_mxu},
          {"xla_hbm", e.xla_hbm},
          {"xla_fusion_us", e.xla_fusion_us},
          {"f32_matmul_passes", e.f32_matmul_passes},
          {"slot_overlap", e.slot_overlap}};
}

}  // namespace

int run_calibrate(const calibrate_options& opts) {
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  std::string error;
  std::vector<measurement_row> all;
  if (!read_measurements(opts.measurements, all, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  config::chip chip;
  config::spec_error chip_error;
  if (!config::load_chip(opts.chip, chip, chip_error)) {
    std::cerr << "error: --chip: " << chip_error.what() << "\n";
    return 2;
  }
  std::string out = opts.out.empty() ? opts.chip + ".fitted.yaml" : opts.out;
  if (!output_dir_exists(out, error) || !output_dir_exists(opts.json, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  std::vector<measurement_row> rows;
  for (auto& r : all)
    if (r.chip == opts.chip)
      rows.push_back(r);
  if (rows.empty()) {
    std::cerr << "error: " << opts.measurements << ": no rows for chip " << opts.chip << "\n";
    return 2;
  }
  human << fmt::format("calibrating {} on {} of {} rows of {}\n", opts.chip, rows.size(),
                       all.size(), opts.measurements);

  tpu_nodes::worker_client worker(tpu_nodes::worker_options::defaults());
  if (!worker.start(error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  auto deadline = std::chrono::milliseconds(static_cast<int64_t>(opts.deadline_seconds * 1000));
  std::vector<tpu_nodes::model::calibration_point> points;
  for (const auto& row : rows) {
    tpu_nodes::model::calibration_point p;
    p.label = fs::path(row.spec).filename().string() + " "
              + (row.kernel == "reference" ? "reference" : fs::path(row.kernel).filename().string());
    p.source = row.source.substr(0, row.source.find(' '));  // the address names the source
    p.measured_us = row.measured_us;
    p.reference = row.kernel == "reference";
    int code = trace_row(row, worker, deadline, p.structure, error);
    if (code != 0) {
      std::cerr << "error: " << opts.measurements << ":" << error << "\n";
      return code;
    }
    double predicted = 0;
    if (!tpu_nodes::model::predict_point(p, chip, predicted, error)) {
      std::cerr << "error: line " << row.line << ": " << error << "\n";
      return 3;
    }
    points.push_back(std::move(p));
  }

  auto report = tpu_nodes::model::calibrate(points, chip);
  // Four significant digits: the points cannot pin the constants any closer.
  for (double* v : {&report.fitted.mxu, &report.fitted.vpu, &report.fitted.hbm,
                    &report.fitted.dma_latency_us, &report.fitted.step_overhead_us,
                    &report.fitted.kernel_launch_us, &report.fitted.xla_mxu,
                    &report.fitted.xla_hbm, &report.fitted.xla_fusion_us,
                    &report.fitted.f32_matmul_passes, &report.fitted.slot_overlap})
    *v = *v == 0 ? 0 : std::stod(fmt::format("{:.4g}", *v));
  human << fmt::format("{:<48} {:>12} {:>12} {:>12}\n", "point", "measured us", "before us",
                       "after us");
  nlohmann::json rows_json = nlohmann::json::array();
  for (size_t i = 0; i < points.size(); ++i) {
    const auto& b = report.before.points[i];
    const auto& a = report.after.points[i];
    human << fmt::format("{:<48} {:>12.1f} {:>12.1f} {:>12.1f}\n", points[i].label,
                         points[i].measured_us, b.predicted_us, a.predicted_us);
    rows_json.push_back({{"line", rows[i].line},
                         {"point", points[i].label},
                         {"measured_us", points[i].measured_us},
                         {"before_us", b.predicted_us},
                         {"after_us", a.predicted_us}});
  }
  human << fmt::format("median error: {:.1f}% before, {:.1f}% after; worst ratio {:.2f}x before, "
                       "{:.2f}x after (modeled against measured)\n",
                       100 * report.before.median_error, 100 * report.after.median_error,
                       report.before.max_ratio, report.after.max_ratio);
  nlohmann::json overheads = nlohmann::json::object();
  for (const auto& [source, us] : report.host_overhead_us) {
    human << fmt::format("host overhead per call in {}: {:.1f} us (not part of the chip)\n",
                         source, us);
    overheads[source] = us;
  }

  std::ifstream in(chip.source_path);
  std::stringstream text;
  text << in.rdbuf();
  auto note = fmt::format("fitted to {} points of {}: median error {:.1f}% -> {:.1f}%",
                          points.size(), fs::path(opts.measurements).filename().string(),
                          100 * report.before.median_error, 100 * report.after.median_error);
  auto fitted = config::fitted_chip_yaml(text.str(), report.fitted, note, error);
  if (fitted.empty() || !write_output(out, fitted, error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  human << "fitted chip file: " << out << "\n";
  if (!opts.json.empty()) {
    nlohmann::json j{{"chip", opts.chip},
                     {"timing", "modeled"},
                     {"points", rows_json},
                     {"before", errors_json(report.before)},
                     {"after", errors_json(report.after)},
                     {"host_overhead_us", overheads},
                     {"fitted", efficiency_json(report.fitted)},
                     {"prior", efficiency_json(chip.efficiency)},
                     {"out", out}};
    if (!write_output(opts.json, j.dump(2) + "\n", error)) {
      std::cerr << "error: " << error << "\n";
      return 3;
    }
  }
  return 0;
}

}  // namespace maxkernel::cli
