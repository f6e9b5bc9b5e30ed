// Fits a chip's efficiency constants to measured times: `maxkernel calibrate`. Each point is
// a traced kernel (KernelStructure) or an XLA program (DataflowGraph) with its measured time.
// Measurements of one source share one fixed host overhead per call (dispatch and sync in a
// wall-clock timing loop), fitted with the constants and reported, never written to the chip.
#pragma once

#include "config/chip.hpp"

#include <map>
#include <string>
#include <vector>

namespace maxkernel::tpu_nodes::model {

struct calibration_point {
  std::string label;         // spec and kernel, for the report
  std::string source;        // where the measurement comes from
  double measured_us = 0;
  bool reference = false;    // structure holds a DataflowGraph, else a KernelStructure
  std::string structure;     // the encoded message
};

struct point_error {
  double predicted_us = 0;   // device time plus the source's host overhead
  double ratio = 1;          // predicted / measured
};

struct calibration_errors {
  double median_error = 0;   // median of |predicted - measured| / measured
  double max_ratio = 1;      // largest max(p/m, m/p)
  std::vector<point_error> points;
};

struct calibration_report {
  config::chip_efficiency fitted;
  std::map<std::string, double> host_overhead_us;  // per source, after the fit
  calibration_errors before;  // the chip file's constants (host overheads fitted alone)
  calibration_errors after;
};

// Prices a point on chip; false (with error) when its message does not decode.
bool predict_point(const calibration_point& point, const config::chip& chip, double& time_us,
                   std::string& error);

// Fits every constant of chip.efficiency; a weak pull toward the file's values keeps the ones
// the points cannot tell apart where they were.
calibration_report calibrate(const std::vector<calibration_point>& points,
                             const config::chip& chip);

}  // namespace maxkernel::tpu_nodes::model
