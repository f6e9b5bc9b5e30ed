// The live progress of `maxkernel bench` on stderr: tasks done of the total, the running ones
// with their best speedup so far, the geometric mean of the finished ones, and the time left
// at the current rate. On a terminal one line rewritten in place; elsewhere one line per
// finished task (logs stay readable). Thread-safe: the suite's tasks run concurrently.
#pragma once

#include "messages/supervisor_actor.hpp"

#include <chrono>
#include <map>
#include <mutex>
#include <ostream>
#include <string>

namespace caf {
class actor_system;
}

namespace maxkernel::cli {

class bench_progress {
public:
  bench_progress(std::ostream& out, std::string mode, unsigned total);

  void started(unsigned task, const std::string& name);
  // A running task's best speedup so far (0: nothing correct yet) and candidates evaluated.
  void advanced(unsigned task, double best_speedup, unsigned evaluated);
  // `line`: what to say of its result (speedup, or why it failed); `speedup` its final one.
  void finished(unsigned task, const std::string& line, double speedup);
  // Ends the rewritten line.
  void close();

private:
  struct running {
    std::string name;
    double best = 0;
    unsigned evaluated = 0;
  };
  void print(const std::string& event);  // with the lock held

  std::mutex mutex_;
  std::ostream& out_;
  std::string mode_;
  unsigned total_, done_ = 0;
  double log_sum_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::map<unsigned, running> running_;
};

// A search's progress listener that feeds `task`'s line of `progress` (which must outlive it).
messages::progress_listener_actor spawn_bench_listener(caf::actor_system& sys,
                                                       bench_progress& progress, unsigned task);

}  // namespace maxkernel::cli
