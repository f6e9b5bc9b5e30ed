// `maxkernel calibrate MEASUREMENTS.csv --chip v6e`: fits the chip's efficiency constants to
// measured times, prints the error before and after, and writes the fitted chip file.
#pragma once

#include <string>

namespace maxkernel::cli {

struct calibrate_options {
  std::string measurements;
  std::string chip;
  std::string out;             // fitted chip file; "" = ./<chip>.fitted.yaml
  std::string json;            // "" none, "-" stdout, else a file
  double deadline_seconds = 600;
};

int run_calibrate(const calibrate_options& opts);

}  // namespace maxkernel::cli
