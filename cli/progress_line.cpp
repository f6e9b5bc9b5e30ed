#include "cli/progress_line.hpp"

#include "maxkernel/schema/search.capnp.h"
#include "messages/payload_codec.hpp"

#include <caf/actor_system.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>

namespace maxkernel::cli {

namespace {

bool on_terminal() { return isatty(STDERR_FILENO) == 1; }

messages::progress_listener_actor::behavior_type progress_printer(
  messages::progress_listener_actor::pointer, std::ostream* out, unsigned budget) {
  auto started = std::chrono::steady_clock::now();
  bool tty = on_terminal();
  return {
    [=](messages::progress_atom, const messages::payload& p) {
      std::string error;
      auto msg = messages::open_payload<schema::Progress>(p, error);
      if (!msg)
        return;
      auto r = msg->root<schema::Progress>();
      double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::string best = r.getBestTimeUs() > 0
                           ? (r.getBestSpeedup() > 0
                                ? fmt::format("best {:.2f}x ({:.2f} us modeled)",
                                              r.getBestSpeedup(), r.getBestTimeUs())
                                : fmt::format("best {:.2f} us modeled", r.getBestTimeUs()))
                           : "nothing correct yet";
      std::string line = fmt::format(
        "[{:>6.0f} s] evaluated {}{} · {} · {} in flight · {}", elapsed, r.getEvaluations(),
        budget ? fmt::format("/{}", budget) : "", best, r.getInFlight(), r.getMessage().cStr());
      if (tty)
        *out << "\r\033[K" << line.substr(0, 160) << std::flush;
      else
        *out << line << "\n" << std::flush;
    },
  };
}

}  // namespace

messages::progress_listener_actor spawn_progress_line(caf::actor_system& sys, std::ostream& out,
                                                      unsigned budget_evals) {
  return sys.spawn(progress_printer, &out, budget_evals);
}

void end_progress_line(std::ostream& out) {
  if (on_terminal())
    out << "\n";
}

}  // namespace maxkernel::cli
