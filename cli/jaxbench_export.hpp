// The best kernel in the JAXBench convention (ARCHITECTURE.md, "Contracts": CONFIG,
// create_inputs, workload): the worker's exporter (python -m maxkernel_worker.export) appends
// the task's CONFIG and create_inputs to the kernel module and checks the result with
// jax.eval_shape against the reference. It runs in the venv python (MAXKERNEL_PYTHON) with
// the worker package (MAXKERNEL_WORKER_DIR) on PYTHONPATH, in a private temporary directory.
#pragma once

#include "maxkernel/schema/kernel_spec.capnp.h"

#include <string>

namespace maxkernel::cli {

// out_source: the exported module; false with `error` the exporter's reason (its last line of
// stderr) when the kernel cannot be put in the convention or the exporter cannot run.
bool export_jaxbench_kernel(schema::KernelSpec::Reader spec, const std::string& kernel_source,
                            std::string& out_source, std::string& error);

}  // namespace maxkernel::cli
