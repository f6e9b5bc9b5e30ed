// Whether the kernel's out-of-memory killer ended a process: a worker that ran the host (or
// its memory cgroup) out of memory dies of SIGKILL like one an operator killed, and only the
// kernel's log tells them apart.
#pragma once

#include <string>
#include <string_view>
#include <sys/types.h>

namespace maxkernel::tpu_nodes {

// True when the kernel log (/dev/kmsg: readable by root) records the OOM killer killing
// `pid`; false when it does not, or cannot be read (then the death stays a crash).
bool killed_by_oom_killer(pid_t pid);

// The same test on one kernel log record as /dev/kmsg gives it
// ("3,480,47169851219,-;Memory cgroup out of memory: Killed process 23313 (python3) ...").
bool oom_kill_recorded(std::string_view record, pid_t pid);

}  // namespace maxkernel::tpu_nodes
