#include "cli/bench_progress.hpp"

#include "maxkernel/schema/search.capnp.h"
#include "messages/payload_codec.hpp"

#include <caf/actor_system.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

namespace maxkernel::cli {

bench_progress::bench_progress(std::ostream& out, std::string mode, unsigned total)
    : out_(out), mode_(std::move(mode)), total_(total), tty_(isatty(STDERR_FILENO) == 1) {}

void bench_progress::started(unsigned task, const std::string& name) {
  std::lock_guard lock(mutex_);
  running_[task] = running{name};
  if (tty_)
    print("");
}

void bench_progress::advanced(unsigned task, double best_speedup, unsigned evaluated) {
  std::lock_guard lock(mutex_);
  auto it = running_.find(task);
  if (it == running_.end())
    return;
  it->second.best = best_speedup;
  it->second.evaluated = evaluated;
  if (tty_)
    print("");
}

void bench_progress::finished(unsigned task, const std::string& line, double speedup) {
  std::lock_guard lock(mutex_);
  running_.erase(task);
  ++done_;
  log_sum_ += std::log(speedup > 0 ? speedup : 1.0);
  print(line);
}

void bench_progress::close() {
  std::lock_guard lock(mutex_);
  if (tty_)
    out_ << "\n" << std::flush;
}

void bench_progress::print(const std::string& event) {
  double elapsed =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  std::string left = "time left unknown";
  if (done_ > 0 && done_ < total_)
    left = fmt::format("~{:.0f} min left", elapsed / done_ * (total_ - done_) / 60);
  else if (done_ == total_)
    left = "done";
  std::string runs;
  for (const auto& [i, r] : running_)
    runs += fmt::format("{}{} {}", runs.empty() ? "" : ", ", r.name,
                        r.best > 0 ? fmt::format("{:.2f}x", r.best)
                                   : fmt::format("{} evaluated", r.evaluated));
  auto head = fmt::format("[{:>6.0f} s] {} {}/{} done", elapsed, mode_, done_, total_);
  if (done_ > 0)
    head += fmt::format(", geomean {:.2f}x", std::exp(log_sum_ / done_));
  if (tty_) {
    if (!event.empty())
      out_ << "\r\033[K" << event << "\n";
    auto line = fmt::format("{} · {} running{}{} · {}", head, running_.size(),
                            runs.empty() ? "" : ": ", runs, left);
    out_ << "\r\033[K" << line.substr(0, 200) << std::flush;
  } else {
    out_ << fmt::format("{} · {} · {} running · {}\n", head, event, running_.size(), left)
         << std::flush;
  }
}

namespace {

messages::progress_listener_actor::behavior_type bench_listener(
  messages::progress_listener_actor::pointer, bench_progress* progress, unsigned task) {
  return {
    [=](messages::progress_atom, const messages::payload& p) {
      std::string error;
      auto msg = messages::open_payload<schema::Progress>(p, error);
      if (!msg)
        return;
      auto r = msg->root<schema::Progress>();
      progress->advanced(task, r.getBestSpeedup(), r.getEvaluations());
    },
  };
}

}  // namespace

messages::progress_listener_actor spawn_bench_listener(caf::actor_system& sys,
                                                       bench_progress& progress, unsigned task) {
  return sys.spawn(bench_listener, &progress, task);
}

}  // namespace maxkernel::cli
