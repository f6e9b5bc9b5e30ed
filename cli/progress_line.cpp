#include "cli/progress_line.hpp"

#include "maxkernel/schema/cluster.capnp.h"
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

void print(std::ostream* out, bool tty, const std::string& line) {
  if (tty)
    *out << "\r\033[K" << line.substr(0, 160) << std::flush;
  else
    *out << line << "\n" << std::flush;
}

messages::progress_listener_actor::behavior_type progress_printer(
  messages::progress_listener_actor::pointer self, std::ostream* out, unsigned budget,
  messages::dispatcher_actor dispatcher) {
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
      auto head = fmt::format("[{:>6.0f} s] evaluated {}{} · {}", elapsed, r.getEvaluations(),
                              budget ? fmt::format("/{}", budget) : "", best);
      std::string tail = r.getMessage().cStr();
      std::string in_flight = fmt::format("{} in flight", r.getInFlight());
      if (!dispatcher)
        return print(out, tty, fmt::format("{} · {} · {}", head, in_flight, tail));
      // Nodes busy come from the dispatcher; awaited, so lines keep the order of events.
      self->request(dispatcher, std::chrono::seconds(2), messages::status_atom::value)
        .await(
          [=](const messages::payload& status) {
            std::string why;
            auto st = messages::open_payload<schema::DispatcherStatus>(status, why);
            if (!st)
              return print(out, tty, fmt::format("{} · {} · {}", head, in_flight, tail));
            auto nodes = st->root<schema::DispatcherStatus>().getNodes();
            unsigned busy = 0, alive = 0;
            for (auto n : nodes) {
              busy += n.getAlive() && n.getInFlight() > 0 ? 1 : 0;
              alive += n.getAlive() ? 1 : 0;
            }
            print(out, tty, fmt::format("{} · {}/{} nodes busy · {}", head, busy, alive, tail));
          },
          [=](caf::error&) { print(out, tty, fmt::format("{} · {} · {}", head, in_flight, tail)); });
    },
  };
}

}  // namespace

messages::progress_listener_actor spawn_progress_line(caf::actor_system& sys, std::ostream& out,
                                                      unsigned budget_evals,
                                                      messages::dispatcher_actor dispatcher) {
  return sys.spawn(progress_printer, &out, budget_evals, std::move(dispatcher));
}

void end_progress_line(std::ostream& out) {
  if (on_terminal())
    out << "\n";
}

}  // namespace maxkernel::cli
