// The measurements a TPU user brings to `maxkernel calibrate`: a CSV with the columns spec,
// kernel (a file or "reference"), chip, measured_us, source; paths relative to the CSV.
#pragma once

#include <string>
#include <vector>

namespace maxkernel::cli {

struct measurement_row {
  unsigned line = 0;           // 1-based line of the row in the file
  std::string spec;            // resolved path
  std::string kernel;          // resolved path, or "reference"
  std::string chip;
  double measured_us = 0;
  std::string source;
};

// Reads and validates the whole file; on bad input returns false with `error` naming the
// file, line and column.
bool read_measurements(const std::string& path, std::vector<measurement_row>& rows,
                       std::string& error);

}  // namespace maxkernel::cli
