#include "actors/kernel_diff.hpp"

#include <dtl/dtl.hpp>

#include <sstream>
#include <vector>

namespace maxkernel::actors {

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

}  // namespace

std::string unified_diff(const std::string& before, const std::string& after,
                         const std::string& before_name, const std::string& after_name) {
  if (before == after)
    return "";
  auto a = lines_of(before), b = lines_of(after);
  dtl::Diff<std::string, std::vector<std::string>> diff(a, b);
  // Kernels are a few hundred lines: the exact edit script is cheap.
  diff.compose();
  diff.composeUnifiedHunks();
  std::ostringstream out;
  out << "--- " << before_name << "\n+++ " << after_name << "\n";
  diff.printUnifiedFormat(out);
  return out.str();
}

}  // namespace maxkernel::actors
