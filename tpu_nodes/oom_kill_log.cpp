#include "tpu_nodes/oom_kill_log.hpp"

#include <cerrno>
#include <fcntl.h>
#include <unistd.h>

namespace maxkernel::tpu_nodes {

bool oom_kill_recorded(std::string_view record, pid_t pid) {
  // "Out of memory: Killed process N (comm)" (the host) and "Memory cgroup out of memory:
  // Killed process N (comm)" (a cgroup's limit) both say it in these words.
  std::string needle = "ut of memory: Killed process " + std::to_string(pid) + " (";
  return record.find(needle) != std::string_view::npos;
}

bool killed_by_oom_killer(pid_t pid) {
  if (pid <= 0)
    return false;
  int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return false;
  // One record per read, oldest first, until none is left (EAGAIN). The ring buffer holds
  // the recent past: a worker's death is read about as it is reaped, so its record is there.
  char buf[8192];
  bool found = false;
  for (int records = 0; records < 100000 && !found; ++records) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EPIPE)  // records overwritten while reading: go on with the next
        continue;
      if (errno == EINTR)
        continue;
      break;  // EAGAIN: the end; anything else: not readable here
    }
    if (n == 0)
      break;
    found = oom_kill_recorded(std::string_view(buf, static_cast<size_t>(n)), pid);
  }
  ::close(fd);
  return found;
}

}  // namespace maxkernel::tpu_nodes
