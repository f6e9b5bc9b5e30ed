#include "cli/interrupt_stop.hpp"

#include "maxkernel/schema/search.capnp.h"
#include "messages/capnp_io.hpp"

#include <capnp/message.h>

#include <chrono>
#include <signal.h>
#include <ostream>

namespace maxkernel::cli {

namespace {

// The handler only raises the flag (async-signal-safe); the watcher thread acts on it.
std::atomic<bool> interrupted{false};
std::atomic<bool> searching{false};  // before the search starts Ctrl-C quits as it always did

void on_sigint(int) {
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process
  if (!searching) {
    std::raise(SIGINT);
    return;
  }
  interrupted = true;
}

}  // namespace

interrupt_stop::interrupt_stop(std::ostream& err) : err_(err) {
  interrupted = false;
  searching = false;
  // Started with SIGINT ignored (a script's background job: the shell ignores it there so
  // that the terminal's Ctrl-C spares the job): it stays ignored, as shells and Python do.
  // Looked at before anything is installed, so no SIGINT reaches on_sigint meanwhile.
  struct sigaction current {};
  if (sigaction(SIGINT, nullptr, &current) == 0 && current.sa_handler == SIG_IGN)
    previous_ = SIG_IGN;
  else
    previous_ = std::signal(SIGINT, on_sigint);
  watcher_ = std::thread([this] { watch(); });
}

interrupt_stop::~interrupt_stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  watcher_.join();
  searching = false;
  std::signal(SIGINT, previous_ == SIG_ERR ? SIG_DFL : previous_);
}

void interrupt_stop::on_search(search_controller controller) {
  std::lock_guard<std::mutex> lock(mutex_);
  searching = static_cast<bool>(controller);
  controller_ = std::move(controller);
}

void interrupt_stop::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // Polled: a condition variable cannot be notified from a signal handler.
    wake_.wait_for(lock, std::chrono::milliseconds(100));
    if (closing_)
      return;
    if (!interrupted || !controller_)
      continue;
    interrupted = false;
    auto controller = controller_;
    lock.unlock();
    capnp::MallocMessageBuilder msg;
    msg.initRoot<schema::SearchControl>().setStop("interrupted");
    std::string progress, error;
    if (controller(messages::encode(msg), progress, error))
      err_ << "\ninterrupted: the search ends after its candidates in flight, with its outputs "
              "(Ctrl-C again to quit at once)\n";
    else
      err_ << "\ninterrupted: " << error << " (Ctrl-C again to quit at once)\n";
    lock.lock();
  }
}

}  // namespace maxkernel::cli
