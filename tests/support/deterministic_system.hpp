// An actor system under CAF's deterministic test scheduler (scheduler.policy = testing) for
// GoogleTest: actors run only when the test says so, and time is the test clock's, moved
// by advance_time(). Debian ships CAF's test DSL headers but not the unit-test library
// they need, so this is the part of caf::test::dsl's test_coordinator_fixture we use.
#pragma once

#include "messages/type_registry.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include <chrono>
#include <utility>

namespace maxkernel::test_support {

class deterministic_config : public caf::actor_system_config {
public:
  deterministic_config() {
    set("scheduler.policy", caf::atom("testing"));
    set("logger.file-verbosity", caf::atom("quiet"));
    set("logger.console-verbosity", caf::atom("quiet"));
    messages::register_types(*this);
  }
};

class deterministic_system {
public:
  deterministic_system()
    : sys(cfg),
      self(sys, true),
      sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    // The test clock starts at 0; actors that compute "now - x" want a later start.
    sched.clock().current_time += std::chrono::hours(1);
  }

  // Runs messages (not timers) until no actor has one left; the number run.
  size_t run_messages() {
    size_t n = 0;
    while (sched.try_run_once())
      ++n;
    return n;
  }

  // Runs messages and fires pending timers, earliest first, until nothing is left.
  size_t run() {
    size_t n = 0;
    for (;;) {
      auto progress = run_messages();
      if (sched.trigger_timeout())
        ++progress;
      if (progress == 0)
        return n;
      n += progress;
    }
  }

  // Moves the test clock; timers that come due fire (their messages are not yet run).
  size_t advance_time(caf::timespan d) {
    return sched.clock().advance_time(d);
  }

  // Hands the first message waiting for `self` to the matching handler; false when there
  // is none (never blocks).
  template <class... Fs>
  bool receive_now(Fs&&... handlers) {
    bool got = true;
    self->receive(std::forward<Fs>(handlers)...,
                  caf::after(std::chrono::seconds(0)) >> [&] { got = false; });
    return got;
  }

  deterministic_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  caf::scheduler::test_coordinator& sched;
};

}  // namespace maxkernel::test_support
