// The searches running in a cluster supervisor, by submission id, each with the means to
// control it (SearchControl: stop, pause, resume, budget) from the operator shell. Filled by
// the submission runs' threads, read by the shell's; CAF-free.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace maxkernel::cli {

// Sends SearchControl bytes to one running search: its Progress bytes afterwards, or false
// with `error` (no search running, or no answer).
using search_controller =
  std::function<bool(const std::string& control, std::string& progress, std::string& error)>;

class search_controls {
public:
  // `controller` empty: the search of `id` ended.
  void set(const std::string& id, search_controller controller);
  // The controller of `id`'s running search; empty when none runs (not started yet, ended).
  search_controller get(const std::string& id) const;

private:
  mutable std::mutex mutex_;
  std::map<std::string, search_controller> controllers_;
};

}  // namespace maxkernel::cli
