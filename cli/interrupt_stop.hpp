// Ctrl-C during `maxkernel optimize`: the first SIGINT stops the search as an operator's
// `stop` would (its candidates in flight finish, the outputs are written with the best so
// far); a second one ends the process at once, as SIGINT always did. CAF-free.
#pragma once

#include "cli/search_controls.hpp"

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <iosfwd>
#include <mutex>
#include <thread>

namespace maxkernel::cli {

class interrupt_stop {
public:
  // Installs the SIGINT handler; messages go to `err`.
  explicit interrupt_stop(std::ostream& err);
  // Restores SIGINT's previous handler.
  ~interrupt_stop();
  interrupt_stop(const interrupt_stop&) = delete;
  interrupt_stop& operator=(const interrupt_stop&) = delete;

  // run_io.on_search: the running search (empty: it ended).
  void on_search(search_controller controller);

private:
  void watch();

  std::ostream& err_;
  std::mutex mutex_;
  std::condition_variable wake_;
  search_controller controller_;
  bool closing_ = false;
  void (*previous_)(int) = SIG_DFL;
  std::thread watcher_;
};

}  // namespace maxkernel::cli
