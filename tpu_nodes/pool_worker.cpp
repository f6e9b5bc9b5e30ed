#include "tpu_nodes/pool_worker.hpp"

#include "maxkernel/schema/kernel_spec.capnp.h"
#include "maxkernel/schema/kernel_structure.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/atoms.hpp"
#include "messages/error.hpp"
#include "messages/eval_failure.hpp"
#include "messages/payload_codec.hpp"
#include "tpu_nodes/evaluation_pipeline.hpp"
#include "tpu_nodes/pool_atoms.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <kj/exception.h>

#include <algorithm>
#include <iostream>
#include <memory>

namespace maxkernel::tpu_nodes {

namespace {

using namespace std::chrono_literals;
using messages::error_code;
using messages::payload;

// How long a health check after a crash or timeout may take; a restarted worker answers
// pings in milliseconds.
constexpr auto ping_deadline = 10s;

struct pool_worker_state {
  pool_worker_settings settings;
  std::unique_ptr<worker_client> client;
  caf::actor_addr pool;  // weak: the pool owns its workers, not the other way round
  bool up = false;
  std::chrono::milliseconds backoff{0};
  static inline const char* name = "pool_worker";
};

using worker_actor = caf::stateful_actor<pool_worker_state>;

error_code code_for(schema::ErrorClass cls) {
  switch (cls) {
    case schema::ErrorClass::BAD_INPUT: return error_code::bad_input;
    case schema::ErrorClass::TOO_LARGE: return error_code::too_large;
    case schema::ErrorClass::TIMEOUT: return error_code::worker_timeout;
    case schema::ErrorClass::CRASH: return error_code::worker_crashed;
    case schema::ErrorClass::RESOURCE_LIMIT: return error_code::too_large;  // the task's size
    default: return error_code::internal;
  }
}

template <class... Ts>
void tell_pool(worker_actor* self, Ts&&... xs) {
  if (auto pool = caf::actor_cast<caf::actor>(self->state.pool))
    self->send(pool, std::forward<Ts>(xs)...);
}

// A failed start: report it and try again after the backoff, which doubles up to its cap.
void retry_later(worker_actor* self, const std::string& error) {
  auto& st = self->state;
  st.up = false;
  auto wait = st.backoff.count() > 0 ? st.backoff : st.settings.backoff_initial;
  // On the process's stderr (a node's log): the pool's status says it too, but an operator
  // reading the log should see a worker that keeps failing without asking.
  std::cerr << "worker " << st.settings.index << " is down (" << error << "); starting it again in "
            << wait.count() << " ms\n";
  tell_pool(self, down_atom::value, static_cast<uint32_t>(st.settings.index), error,
            static_cast<uint64_t>(wait.count()));
  self->delayed_send(self, wait, start_atom::value);
  st.backoff = std::min(wait * 2, st.settings.backoff_max);
}

void start(worker_actor* self) {
  auto& st = self->state;
  if (!st.client)
    st.client = std::make_unique<worker_client>(st.settings.options);
  std::string error;
  if (!st.client->start(error)) {
    retry_later(self, error);
    return;
  }
  st.up = true;
  st.backoff = std::chrono::milliseconds(0);
  auto& d = st.client->description();
  tell_pool(self, ready_atom::value, static_cast<uint32_t>(st.settings.index),
            static_cast<int64_t>(d.pid), d.jax_version, d.platform,
            static_cast<uint32_t>(d.devices), static_cast<uint32_t>(st.client->restarts()));
}

// The result of one job, sent to the pool, and the worker's health after it: a crash or
// timeout restarts the worker inside the client; if that restart failed, the worker is down
// and starts again after a backoff. `cause` says what restarted it when the job itself
// succeeded (an evaluation reports a candidate that crashed or hung as its result).
void finish(worker_actor* self, uint64_t job, unsigned restarts_before, payload result,
            error_code code, std::string message, const std::string& cause = {}) {
  auto& st = self->state;
  std::string health_error;
  if (st.client->restarts() != restarts_before) {
    const std::string& why = !message.empty() ? message
                             : !cause.empty() ? cause
                                              : std::string("it stopped answering during job ")
                                                  + std::to_string(job);
    std::cerr << "worker " << st.settings.index << " restarted (restart "
              << st.client->restarts() << ") after: " << why << "\n";
    auto pong = st.client->ping(ping_deadline);
    if (!pong.ok) {
      st.up = false;
      health_error = "the worker did not come back after a restart: " + pong.message;
    }
  }
  long pid = st.up ? st.client->description().pid : 0;
  tell_pool(self, done_atom::value, static_cast<uint32_t>(st.settings.index), job,
            std::move(result), static_cast<uint8_t>(code), std::move(message), st.up,
            static_cast<int64_t>(pid), static_cast<uint32_t>(st.client->restarts()));
  if (!st.up)
    retry_later(self, health_error);
}

bool refuse_when_down(worker_actor* self, uint64_t job) {
  if (self->state.up && self->state.client)
    return false;
  tell_pool(self, done_atom::value, static_cast<uint32_t>(self->state.settings.index), job,
            payload{}, static_cast<uint8_t>(error_code::worker_unavailable),
            std::string("the worker is not running"), false, int64_t{0},
            static_cast<uint32_t>(self->state.client ? self->state.client->restarts() : 0));
  return true;
}

// A worker killed under its client can surface as an exception (a ZeroMQ error on its
// socket, a failed restart): the job is refused as worker_unavailable (not the candidate's
// fault: a dispatcher sends it to another node) and the worker starts afresh after the
// backoff. The actor must not end on it: the pool's slot would never come back and every job
// it held would fail ("the pool's worker actor ended"), ending the searches that sent them.
template <class F>
void guarded(worker_actor* self, uint64_t job, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    auto& st = self->state;
    auto restarts = st.client ? st.client->restarts() : 0u;
    std::string why = std::string("the worker failed: ") + e.what();
    st.up = false;
    st.client.reset();  // a fresh client (and process) at the next start
    if (job != 0)
      tell_pool(self, done_atom::value, static_cast<uint32_t>(st.settings.index), job,
                payload{}, static_cast<uint8_t>(error_code::worker_unavailable), why, false,
                int64_t{0}, static_cast<uint32_t>(restarts));
    retry_later(self, why);
  }
}

caf::behavior pool_worker(worker_actor* self, pool_worker_settings settings,
                          caf::actor_addr pool) {
  self->state.settings = std::move(settings);
  self->state.pool = pool;
  // The worker ends with its pool.
  self->monitor(pool);
  self->set_down_handler([self](caf::down_msg&) { self->quit(); });
  self->send(self, start_atom::value);
  return {
    [self](start_atom) { guarded(self, 0, [&] { start(self); }); },
    [self](messages::evaluate_atom, uint64_t job, const payload& request, uint32_t budget_ms) {
      if (refuse_when_down(self, job))
        return;
      guarded(self, job, [&] {
        auto restarts = self->state.client->restarts();
        std::string err;
        auto msg = messages::open_payload<schema::EvalRequest>(request, err);
        if (!msg) {
          finish(self, job, restarts, payload{}, error_code::malformed_message,
                 "EvalRequest: " + err);
          return;
        }
        pipeline_settings ps;
        ps.backend = self->state.settings.backend;
        ps.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(budget_ms);
        pipeline_outcome out;
        try {
          out = run_evaluation(*self->state.client, msg->root<schema::EvalRequest>(), ps);
        } catch (const kj::Exception& e) {  // a field of the request that does not read
          out.error_class = schema::ErrorClass::BAD_INPUT;
          out.message = std::string("EvalRequest: ") + e.getDescription().cStr();
        } catch (const std::exception& e) {  // a bug: the job fails, the worker stays
          out.error_class = schema::ErrorClass::INTERNAL;
          out.message = e.what();
        }
        if (!out.ok) {
          finish(self, job, restarts, payload{}, code_for(out.error_class), std::move(out.message));
          return;
        }
        std::string cause;
        if (self->state.client->restarts() != restarts) {
          std::string ignored;
          if (auto r = messages::decode<schema::EvalResult>(out.result, ignored))
            cause = "the candidate's evaluation: "
                    + messages::failure_message(r->root<schema::EvalResult>());
        }
        finish(self, job, restarts, payload{capnp::typeId<schema::EvalResult>(), std::move(out.result)},
               error_code::none, {}, cause);
      });
    },
    [self](messages::load_atom, uint64_t job, const std::string& path, uint32_t budget_ms) {
      if (refuse_when_down(self, job))
        return;
      guarded(self, job, [&] {
        auto& client = *self->state.client;
        auto restarts = client.restarts();
        auto r = client.load_task(path, self->state.settings.options.memory_limit_bytes,
                                  std::chrono::milliseconds(budget_ms));
        if (!r.ok) {
          finish(self, job, restarts, payload{}, code_for(r.error_class), std::move(r.message));
          return;
        }
        finish(self, job, restarts, payload{capnp::typeId<schema::KernelSpec>(), std::move(r.bytes)},
               error_code::none, {});
      });
    },
    [self](messages::analyze_atom, uint64_t job, const payload& request, uint32_t budget_ms) {
      if (refuse_when_down(self, job))
        return;
      guarded(self, job, [&] {
        auto& client = *self->state.client;
        auto restarts = client.restarts();
        std::string err;
        auto msg = messages::open_payload<schema::AnalyzeRequest>(request, err);
        if (!msg) {
          finish(self, job, restarts, payload{}, error_code::malformed_message,
                 "AnalyzeRequest: " + err);
          return;
        }
        auto a = msg->root<schema::AnalyzeRequest>();
        auto r = client.analyze(a.getSpec(), a.getConfiguration(), std::chrono::milliseconds(budget_ms));
        if (!r.ok) {
          finish(self, job, restarts, payload{}, code_for(r.error_class), std::move(r.message));
          return;
        }
        finish(self, job, restarts,
               payload{capnp::typeId<schema::DataflowGraph>(), std::move(r.bytes)}, error_code::none, {});
      });
    },
  };
}

}  // namespace

caf::actor spawn_pool_worker(caf::actor_system& sys, pool_worker_settings settings,
                             const caf::actor_addr& pool, bool detached) {
  if (detached)
    return sys.spawn<caf::detached>(pool_worker, std::move(settings), pool);
  return sys.spawn(pool_worker, std::move(settings), pool);
}

}  // namespace maxkernel::tpu_nodes
