#include "tpu_nodes/model/calibration.hpp"

#include "messages/capnp_io.hpp"
#include "tpu_nodes/model/tpu_model.hpp"

#include <capnp/message.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace maxkernel::tpu_nodes::model {

namespace {

// A point's message, validated once, then read many times: the fit prices every point
// thousands of times, beyond any per-reader traversal limit.
using loaded_point = std::optional<messages::decoded_message>;

bool load(const calibration_point& p, loaded_point& out, std::string& error) {
  out = p.reference ? messages::decode<schema::DataflowGraph>(p.structure, error)
                    : messages::decode<schema::KernelStructure>(p.structure, error);
  if (!out)
    return false;
  out->allow_rereading();
  return true;
}

double price(loaded_point& p, bool reference, const config::chip& chip) {
  capnp::MallocMessageBuilder scratch;
  auto profile = scratch.initRoot<schema::Profile>();
  if (reference)
    return price_xla(p->root<schema::DataflowGraph>(), chip, profile).time_us;
  return price_kernel(p->root<schema::KernelStructure>(), chip, profile).time_us;
}

struct parameter {
  double config::chip_efficiency::*field;
  double low, high;
  bool fraction;  // pulled toward the prior by difference, else relative to max(prior, 1)
};

const std::vector<parameter>& parameters() {
  using e = config::chip_efficiency;
  static const std::vector<parameter> p{
      {&e::mxu, 0.05, 1, true},           {&e::vpu, 0.05, 1, true},
      {&e::hbm, 0.05, 1, true},           {&e::dma_latency_us, 0, 20, false},
      {&e::step_overhead_us, 0, 20, false}, {&e::kernel_launch_us, 0, 200, false},
      {&e::xla_mxu, 0.05, 1, true},       {&e::xla_hbm, 0.05, 1, true},
      {&e::xla_fusion_us, 0, 200, false}, {&e::f32_matmul_passes, 1, 6, false},
      {&e::slot_overlap, 0, 1, true}};
  return p;
}

constexpr double prior_weight = 1e-2;

struct fit_state {
  std::vector<loaded_point>* loaded;
  const std::vector<calibration_point>* points;
  std::vector<std::string> sources;   // distinct, in first-seen order
  std::vector<size_t> source_of;      // per point
  config::chip chip;
  config::chip_efficiency prior;
  std::vector<double> device_us;      // cache of the current device predictions
};

void predict_all(fit_state& s) {
  for (size_t i = 0; i < s.points->size(); ++i)
    s.device_us[i] = price((*s.loaded)[i], (*s.points)[i].reference, s.chip);
}

// Host overhead per source that minimises the squared log error given device predictions:
// a one-dimensional convex-ish search per source.
std::vector<double> best_overheads(const fit_state& s) {
  std::vector<double> out(s.sources.size(), 0);
  for (size_t k = 0; k < s.sources.size(); ++k) {
    auto loss = [&](double h) {
      double sum = 0;
      for (size_t i = 0; i < s.device_us.size(); ++i)
        if (s.source_of[i] == k) {
          double r = std::log((s.device_us[i] + h) / (*s.points)[i].measured_us);
          sum += r * r;
        }
      return sum;
    };
    double hi = 0;
    for (size_t i = 0; i < s.device_us.size(); ++i)
      if (s.source_of[i] == k)
        hi = std::max(hi, (*s.points)[i].measured_us);
    double a = 0, b = hi;
    for (int it = 0; it < 80; ++it) {
      double m1 = a + (b - a) / 3, m2 = b - (b - a) / 3;
      (loss(m1) <= loss(m2) ? b : a) = loss(m1) <= loss(m2) ? m2 : m1;
    }
    out[k] = loss(0) <= loss((a + b) / 2) ? 0 : (a + b) / 2;
  }
  return out;
}

double objective(fit_state& s, std::vector<double>* overheads_out = nullptr) {
  predict_all(s);
  auto h = best_overheads(s);
  double sum = 0;
  for (size_t i = 0; i < s.device_us.size(); ++i) {
    double r = std::log((s.device_us[i] + h[s.source_of[i]]) / (*s.points)[i].measured_us);
    sum += r * r;
  }
  sum /= std::max<size_t>(1, s.device_us.size());
  for (const auto& p : parameters()) {
    double v = s.chip.efficiency.*p.field, v0 = s.prior.*p.field;
    double d = p.fraction ? v - v0 : (v - v0) / std::max(1.0, v0);
    sum += prior_weight * d * d;
  }
  if (overheads_out)
    *overheads_out = h;
  return sum;
}

calibration_errors errors_of(fit_state& s) {
  std::vector<double> h;
  objective(s, &h);
  calibration_errors e;
  std::vector<double> rel;
  for (size_t i = 0; i < s.device_us.size(); ++i) {
    double measured = (*s.points)[i].measured_us;
    double predicted = s.device_us[i] + h[s.source_of[i]];
    e.points.push_back({predicted, predicted / measured});
    rel.push_back(std::abs(predicted - measured) / measured);
    e.max_ratio = std::max(e.max_ratio, std::max(predicted / measured, measured / predicted));
  }
  if (!rel.empty()) {
    std::sort(rel.begin(), rel.end());
    size_t n = rel.size();
    e.median_error = n % 2 ? rel[n / 2] : (rel[n / 2 - 1] + rel[n / 2]) / 2;
  }
  return e;
}

}  // namespace

bool predict_point(const calibration_point& point, const config::chip& chip, double& time_us,
                   std::string& error) {
  loaded_point p;
  if (!load(point, p, error))
    return false;
  time_us = price(p, point.reference, chip);
  return true;
}

calibration_report calibrate(const std::vector<calibration_point>& points,
                             const config::chip& chip) {
  std::vector<loaded_point> loaded(points.size());
  std::string error;
  for (size_t i = 0; i < points.size(); ++i)
    load(points[i], loaded[i], error);  // callers pass points predict_point accepted
  fit_state s{&loaded, &points, {}, {}, chip, chip.efficiency, std::vector<double>(points.size())};
  for (const auto& p : points) {
    auto it = std::find(s.sources.begin(), s.sources.end(), p.source);
    s.source_of.push_back(static_cast<size_t>(it - s.sources.begin()));
    if (it == s.sources.end())
      s.sources.push_back(p.source);
  }
  calibration_report report;
  report.before = errors_of(s);

  // Coordinate descent: a golden-section search along each constant in turn, until a sweep
  // no longer improves the objective.
  double best = objective(s);
  const double phi = (std::sqrt(5.0) - 1) / 2;
  for (int sweep = 0; sweep < 25; ++sweep) {
    double start = best;
    for (const auto& p : parameters()) {
      double& v = s.chip.efficiency.*p.field;
      double keep = v;
      double a = p.low, b = p.high;
      auto at = [&](double x) {
        v = x;
        return objective(s);
      };
      double c = b - phi * (b - a), d = a + phi * (b - a);
      double fc = at(c), fd = at(d);
      for (int it = 0; it < 40; ++it) {
        if (fc <= fd) {
          b = d; d = c; fd = fc; c = b - phi * (b - a); fc = at(c);
        } else {
          a = c; c = d; fc = fd; d = a + phi * (b - a); fd = at(d);
        }
      }
      double x = fc <= fd ? c : d;
      double fx = at(x);
      if (fx < best) {
        best = fx;
      } else {
        v = keep;
      }
    }
    if (start - best < 1e-10)
      break;
  }
  objective(s);  // leaves device_us at the fitted constants
  report.fitted = s.chip.efficiency;
  report.after = errors_of(s);
  auto h = best_overheads(s);
  for (size_t k = 0; k < s.sources.size(); ++k)
    report.host_overhead_us[s.sources[k]] = h[k];
  return report;
}

}  // namespace maxkernel::tpu_nodes::model
