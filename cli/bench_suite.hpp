// The tasks of a benchmark suite: every native spec (*.yaml), JAXBench task directory
// (baseline.py) and MaxKernel task directory (kernel_task.yaml) under SUITE, found by the
// task-input contract (ARCHITECTURE.md), in path order; a task directory is one task (its
// files are not searched further). `--tasks GLOB[,GLOB...]` keeps those whose name or path
// relative to the suite matches one of the globs.
#pragma once

#include "cli/spec_source.hpp"

#include <string>
#include <vector>

namespace maxkernel::cli {

struct suite_task {
  std::string path;      // as found (SUITE joined with the relative path)
  std::string relative;  // relative to SUITE, without a spec's .yaml (`fused/gemm_relu`)
  std::string name;      // the file's stem or the directory's name
  spec_kind kind = spec_kind::invalid;
};

// The suite's tasks; false with `error` when SUITE is missing, unreadable, or holds no task
// (matching `glob`, when given: comma-separated globs). SUITE may itself be one task.
bool find_suite_tasks(const std::string& suite, const std::string& glob,
                      std::vector<suite_task>& tasks, std::string& error);

}  // namespace maxkernel::cli
