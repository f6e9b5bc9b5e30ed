// Turns a SPEC argument (native YAML file, JAXBench or MaxKernel task directory) into a
// KernelSpec message.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace maxkernel::tpu_nodes {
class worker_client;
}

namespace maxkernel::cli {

enum class spec_kind { native, jaxbench, maxkernel, invalid };

// Classifies the path by the contract: *.yaml is native, a directory with baseline.py is
// JAXBench, one with kernel_task.yaml is MaxKernel.
spec_kind classify_spec(const std::string& path, std::string& error);

struct spec_outcome {
  int exit_code = 0;       // 0 on success, else 2 (bad input) or 3 (environment)
  std::string error;
  std::string spec_bytes;  // an encoded KernelSpec
};

// Reads a task directory (absolute path) into an encoded KernelSpec: a JAX worker's job,
// since task directories are Python. Answers exit_code 0 and the bytes, or 2/3 and why.
using task_loader = std::function<spec_outcome(const std::string& absolute_path)>;

// A task_loader over one JAX worker client.
task_loader worker_task_loader(tpu_nodes::worker_client& worker, uint64_t memory_limit_bytes);

// Loads the spec; `load_task` reads task directories (never called for native specs).
// `chip_override` (the command line's --chip) wins over the spec; without either the chip is
// v6e.
spec_outcome load_spec(const std::string& path, spec_kind kind, const std::string& chip_override,
                       uint64_t memory_limit_bytes, const task_loader& load_task);

}  // namespace maxkernel::cli
