#include "tpu_nodes/worker_pool.hpp"

#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/version.hpp"
#include "tpu_nodes/pool_atoms.hpp"
#include "tpu_nodes/pool_worker.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <capnp/message.h>
#include <unistd.h>

#include <deque>
#include <unordered_map>
#include <vector>

namespace maxkernel::tpu_nodes {

namespace {

using messages::error_code;
using messages::make_error;
using messages::payload;

enum class worker_state { starting, idle, busy, restarting };

const char* to_string(worker_state s) {
  switch (s) {
    case worker_state::starting: return "starting";
    case worker_state::idle: return "idle";
    case worker_state::busy: return "busy";
    case worker_state::restarting: return "restarting";
  }
  return "?";
}

struct worker_slot {
  caf::actor actor;
  worker_state state = worker_state::starting;
  int64_t pid = 0;
  uint32_t restarts = 0;
  uint32_t start_failures = 0;
  std::string last_error;
  uint64_t retry_ms = 0;
  uint64_t job = 0;  // the job it runs while busy
  uint64_t finished = 0;
};

enum class job_kind { evaluate, load, analyze };

struct job {
  uint64_t id = 0;
  job_kind kind = job_kind::evaluate;
  payload request;   // EvalRequest or AnalyzeRequest
  std::string path;  // load
  caf::response_promise promise;
  caf::actor_clock::time_point deadline;
};

struct pool_state {
  pool_config config;
  bool detach = true;
  std::vector<worker_slot> slots;
  std::deque<job> queue;
  std::unordered_map<uint64_t, job> running;
  uint64_t next_job = 1;
  std::string jax_version;
  std::string platform;
  std::vector<caf::response_promise> version_waiters;
  uint64_t evaluations = 0;
  std::string host;
  static inline const char* name = "worker_pool";
};

using pool_actor = caf::stateful_actor<pool_state>;

pool_worker_settings settings_for(const pool_state& st, unsigned index) {
  pool_worker_settings s;
  s.index = index;
  s.backend = st.config.backend;
  s.options = worker_options_for(st.config, index);
  s.backoff_initial = st.config.backoff_initial;
  s.backoff_max = st.config.backoff_max;
  return s;
}

void spawn_worker(pool_actor* self, unsigned index) {
  auto& st = self->state;
  auto worker = spawn_pool_worker(self->system(), settings_for(st, index),
                                  self->address(), st.detach);
  self->monitor(worker);
  st.slots[index].actor = worker;
  st.slots[index].state = worker_state::starting;
}

// True when no worker runs or is about to: each is waiting out a backoff.
bool all_down(const pool_state& st) {
  for (auto& s : st.slots)
    if (s.state != worker_state::restarting)
      return false;
  return true;
}

std::string unavailable_message(const pool_state& st) {
  std::string why;
  for (auto& s : st.slots)
    if (!s.last_error.empty()) {
      why = s.last_error;
      break;
    }
  return "no JAX worker of this node is running (" + std::to_string(st.slots.size())
         + " retrying with backoff)" + (why.empty() ? "" : ": " + why);
}

// While every worker is down, waiting jobs would only reach their deadlines: refuse them.
void refuse_all_if_down(pool_actor* self) {
  auto& st = self->state;
  if (!all_down(st))
    return;
  auto err = make_error(error_code::worker_unavailable, unavailable_message(st));
  for (auto& j : st.queue)
    j.promise.deliver(err);
  st.queue.clear();
  for (auto& rp : st.version_waiters)
    rp.deliver(err);
  st.version_waiters.clear();
}

void dispatch(pool_actor* self) {
  auto& st = self->state;
  while (!st.queue.empty()) {
    auto free = std::find_if(st.slots.begin(), st.slots.end(),
                             [](const worker_slot& s) { return s.state == worker_state::idle; });
    if (free == st.slots.end())
      return;
    auto j = std::move(st.queue.front());
    st.queue.pop_front();
    auto now = self->clock().now();
    if (now >= j.deadline) {
      j.promise.deliver(make_error(error_code::worker_timeout,
                                   "the job waited for a free worker past its deadline"));
      continue;
    }
    auto budget = std::chrono::duration_cast<std::chrono::milliseconds>(j.deadline - now).count();
    auto ms = static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(budget, 1), UINT32_MAX));
    free->state = worker_state::busy;
    free->job = j.id;
    switch (j.kind) {
      case job_kind::evaluate:
        self->send(free->actor, messages::evaluate_atom::value, j.id, j.request, ms);
        break;
      case job_kind::load:
        self->send(free->actor, messages::load_atom::value, j.id, j.path, ms);
        break;
      case job_kind::analyze:
        self->send(free->actor, messages::analyze_atom::value, j.id, j.request, ms);
        break;
    }
    st.running.emplace(j.id, std::move(j));
  }
}

caf::response_promise enqueue(pool_actor* self, job_kind kind, payload request, std::string path,
                              uint32_t budget_ms) {
  auto& st = self->state;
  auto rp = self->make_response_promise();
  if (all_down(st)) {
    rp.deliver(make_error(error_code::worker_unavailable, unavailable_message(st)));
    return rp;
  }
  job j;
  j.id = st.next_job++;
  j.kind = kind;
  j.request = std::move(request);
  j.path = std::move(path);
  j.promise = rp;
  j.deadline = self->clock().now() + std::chrono::milliseconds(budget_ms);
  st.queue.push_back(std::move(j));
  dispatch(self);
  return rp;
}

payload describe(pool_actor* self) {
  auto& st = self->state;
  capnp::MallocMessageBuilder msg;
  auto info = msg.initRoot<schema::NodeInfo>();
  info.setSchemaVersion(schema::SCHEMA_VERSION);
  info.setHost(st.host);
  info.setBackend(st.config.backend);
  info.setWorkers(static_cast<uint32_t>(st.slots.size()));
  info.setJaxVersion(st.jax_version);
  info.setPlatform(st.platform);
  info.setMaxkernelVersion(messages::maxkernel_version());
  info.setQueueDepth(static_cast<uint32_t>(st.queue.size()));
  info.setPoolQueueDepth(static_cast<uint32_t>(st.queue.size()));
  info.setEvaluations(st.evaluations);
  uint32_t busy = 0, idle = 0, restarting = 0;
  auto states = info.initWorkerStates(static_cast<unsigned>(st.slots.size()));
  for (size_t i = 0; i < st.slots.size(); ++i) {
    auto& s = st.slots[i];
    switch (s.state) {
      case worker_state::busy: ++busy; break;
      case worker_state::idle: ++idle; break;
      default: ++restarting; break;
    }
    auto w = states[i];
    w.setIndex(static_cast<uint32_t>(i));
    w.setState(to_string(s.state));
    w.setPid(s.pid);
    w.setRestarts(s.restarts);
    w.setStartFailures(s.start_failures);
    w.setLastError(s.last_error);
    w.setRetryInMs(s.state == worker_state::restarting ? s.retry_ms : 0);
    w.setEvaluations(s.finished);
  }
  info.setWorkersBusy(busy);
  info.setWorkersIdle(idle);
  info.setWorkersRestarting(restarting);
  return messages::make_payload<schema::NodeInfo>(msg);
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0)
    return "localhost";
  return buf;
}

caf::behavior worker_pool(pool_actor* self, pool_config config, bool detach) {
  auto& st = self->state;
  st.config = std::move(config);
  st.detach = detach;
  st.host = host_name();
  st.slots.resize(resolved_worker_count(st.config));
  for (unsigned i = 0; i < st.slots.size(); ++i)
    spawn_worker(self, i);
  // A worker actor that ended (a bug, or an exception): fail its job and replace it.
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (unsigned i = 0; i < st.slots.size(); ++i) {
      auto& s = st.slots[i];
      if (s.actor.address() != dm.source)
        continue;
      if (s.state == worker_state::busy) {
        auto it = st.running.find(s.job);
        if (it != st.running.end()) {
          it->second.promise.deliver(make_error(
            error_code::internal, "the pool's worker actor ended: " + caf::to_string(dm.reason)));
          st.running.erase(it);
        }
      }
      s.pid = 0;
      spawn_worker(self, i);
      return;
    }
  });
  // Ending the pool ends its workers (they monitor it) and so their processes.
  return {
    [self](messages::evaluate_atom, payload& request, uint32_t budget_ms) {
      return enqueue(self, job_kind::evaluate, std::move(request), {}, budget_ms);
    },
    [self](messages::load_atom, std::string& path, uint32_t budget_ms) {
      return enqueue(self, job_kind::load, {}, std::move(path), budget_ms);
    },
    [self](messages::analyze_atom, payload& request, uint32_t budget_ms) {
      return enqueue(self, job_kind::analyze, std::move(request), {}, budget_ms);
    },
    [self](messages::info_atom) { return describe(self); },
    [self](messages::version_atom) {
      auto& st = self->state;
      auto rp = self->make_response_promise();
      if (!st.jax_version.empty())
        rp.deliver(st.jax_version, st.config.backend);
      else if (all_down(st))
        rp.deliver(make_error(error_code::worker_unavailable, unavailable_message(st)));
      else
        st.version_waiters.push_back(rp);
      return rp;
    },
    [self](ready_atom, uint32_t index, int64_t pid, std::string& jax_version,
           std::string& platform, uint32_t, uint32_t restarts) {
      auto& st = self->state;
      if (index >= st.slots.size())
        return;
      auto& s = st.slots[index];
      s.state = worker_state::idle;
      s.pid = pid;
      s.restarts = restarts;
      s.start_failures = 0;
      s.last_error.clear();
      s.retry_ms = 0;
      if (st.jax_version.empty()) {
        st.jax_version = std::move(jax_version);
        st.platform = std::move(platform);
        for (auto& rp : st.version_waiters)
          rp.deliver(st.jax_version, st.config.backend);
        st.version_waiters.clear();
      }
      dispatch(self);
    },
    [self](down_atom, uint32_t index, std::string& error, uint64_t retry_ms) {
      auto& st = self->state;
      if (index >= st.slots.size())
        return;
      auto& s = st.slots[index];
      s.state = worker_state::restarting;
      s.pid = 0;
      ++s.start_failures;
      s.last_error = std::move(error);
      s.retry_ms = retry_ms;
      refuse_all_if_down(self);
    },
    [self](done_atom, uint32_t index, uint64_t job_id, payload& result, uint8_t code,
           std::string& message, bool up, int64_t pid, uint32_t restarts) {
      auto& st = self->state;
      if (index < st.slots.size()) {
        auto& s = st.slots[index];
        s.state = up ? worker_state::idle : worker_state::restarting;
        s.pid = pid;
        s.restarts = restarts;
        s.job = 0;
        ++s.finished;
      }
      auto it = st.running.find(job_id);
      if (it != st.running.end()) {
        auto j = std::move(it->second);
        st.running.erase(it);
        if (code != static_cast<uint8_t>(error_code::none)) {
          j.promise.deliver(make_error(static_cast<error_code>(code), std::move(message)));
        } else {
          if (j.kind == job_kind::evaluate)
            ++st.evaluations;
          j.promise.deliver(std::move(result));
        }
      }
      dispatch(self);
    },
  };
}

}  // namespace

messages::worker_pool_actor spawn_worker_pool(caf::actor_system& sys, pool_config config) {
  bool testing = caf::get_or(sys.config(), "scheduler.policy", caf::atom("stealing"))
                 == caf::atom("testing");
  auto pool = sys.spawn(worker_pool, std::move(config), !testing);
  return caf::actor_cast<messages::worker_pool_actor>(pool);
}

}  // namespace maxkernel::tpu_nodes
