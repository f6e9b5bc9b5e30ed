// What `check` and `model` start with: a node session and the task's KernelSpec. Native
// specs are read before the session starts (bad input never waits for JAX); task directories
// are read by the session's worker, since they are Python.
#pragma once

#include "cli/node_session.hpp"
#include "cli/spec_source.hpp"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "messages/capnp_io.hpp"

#include <memory>
#include <optional>
#include <string>

namespace maxkernel::cli {

struct session_flags {
  std::string chip;                // --chip ("" = the spec's)
  std::string state_dir;
  bool no_store = false;
  unsigned simulate_device_ms = 0;
  uint64_t memory_limit_bytes = 8ull << 30;
  double deadline_seconds = 600;
  unsigned nodes = 1;              // tpu_nodes sharing the worker pool
  unsigned workers = 1;            // JAX workers (0: one per core)
  bool dispatch = false;           // a dispatcher in front of the nodes
};

struct task_session {
  std::unique_ptr<node_session> session;
  std::optional<messages::decoded_message> spec_message;
  schema::KernelSpec::Reader spec() { return spec_message->root<schema::KernelSpec>(); }
};

// The chip a command targets: `flag` (--chip), else the spec's; 0 once its chip file loads,
// else 2 after printing why.
int task_chip(const std::string& flag, schema::KernelSpec::Reader spec, std::string& chip_name);
// The same without printing: 0, or 2 and `error`.
int task_chip(const std::string& flag, schema::KernelSpec::Reader spec, std::string& chip_name,
              std::string& error);

// Loads a task's spec on a running session (native specs in process, task directories through
// its worker): 0, or the exit code (2 bad input, 3 environment) and `error`.
int load_task_spec(node_session& session, const std::string& spec_path, spec_kind kind,
                   const std::string& chip_flag, uint64_t memory_limit_bytes,
                   std::optional<messages::decoded_message>& spec, std::string& error);

// Returns 0, or the exit code after printing the error to stderr.
int open_task_session(const std::string& spec_path, spec_kind kind, const session_flags& flags,
                      task_session& out);

}  // namespace maxkernel::cli
