// One running Python JAX worker process: started in its own process group with a clean
// environment and a private working directory; killed as a whole.
#pragma once

#include "tpu_nodes/worker_options.hpp"

#include <string>
#include <sys/types.h>

namespace maxkernel::tpu_nodes {

class worker_process {
public:
  explicit worker_process(worker_options opts);
  ~worker_process();
  worker_process(const worker_process&) = delete;
  worker_process& operator=(const worker_process&) = delete;

  // Starts the process; false with `error` set when it cannot be spawned.
  bool start(std::string& error);
  // SIGKILLs the process group and reaps it. Idempotent.
  void kill();
  // True while the process has not exited (reaps it when it has).
  bool alive();

  pid_t pid() const { return pid_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& workdir() const { return workdir_; }
  // Last lines of the worker's stderr/stdout log, for error messages.
  std::string log_tail(size_t max_bytes = 2000) const;
  // How the process ended ("exit code 3", "signal 11"); empty while running.
  const std::string& exit_description() const { return exit_description_; }
  // The kernel's out-of-memory killer ended it (not this node, not an operator).
  bool oom_killed() const { return oom_killed_; }

private:
  worker_options opts_;
  pid_t pid_ = -1;
  std::string workdir_;
  std::string endpoint_;
  std::string exit_description_;
  bool oom_killed_ = false;
};

}  // namespace maxkernel::tpu_nodes
