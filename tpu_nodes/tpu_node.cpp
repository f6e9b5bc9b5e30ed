#include "tpu_nodes/tpu_node.hpp"

#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/version.hpp"
#include "search/evaluation_store.hpp"
#include "tpu_nodes/checked_payload.hpp"
#include "tpu_nodes/pool_atoms.hpp"
#include "tpu_nodes/evaluator_revision.hpp"
#include "tpu_nodes/request_key.hpp"
#include "tpu_nodes/store_policy.hpp"
#include "tpu_nodes/task_files.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <capnp/message.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <unordered_map>
#include <vector>

namespace maxkernel::tpu_nodes {

namespace {

using messages::error_code;
using messages::make_error;
using messages::payload;
using clock_point = caf::actor_clock::time_point;

enum class request_kind { evaluate, load, analyze };

// A request the node accepted and has not finished: waiting for the JAX version, at the
// pool, or in simulated device time. It holds a queue slot until then, even after its
// requester got a timeout: the worker is still busy with it.
struct pending_request {
  request_kind kind = request_kind::evaluate;
  caf::response_promise promise;
  bool answered = false;
  clock_point deadline;
  std::chrono::milliseconds limit{0};
  payload request;     // EvalRequest (chip filled in) or AnalyzeRequest
  std::string path;    // load: the directory the worker reads
  std::string shipped_from;  // load of shipped files: the requester's path for `path`
  std::string chip;    // evaluate: the chip it is evaluated for
  std::string spec_name;
  std::string key;     // evaluate: its store key, once the JAX version is known
  payload result;      // held while the simulated device is busy
};

struct node_state {
  node_config config;
  messages::worker_pool_actor pool;
  std::string jax_version;  // "" until the pool has a running worker
  bool version_requested = false;
  std::string misconfiguration;  // refuses every evaluation when set
  std::unordered_map<uint64_t, pending_request> pending;
  std::vector<uint64_t> waiting_version;
  uint64_t next_id = 1;
  uint64_t evaluations = 0;
  uint64_t cache_hits = 0;
  uint64_t timeouts = 0;
  uint64_t refused = 0;
  uint64_t store_errors = 0;
  clock_point device_free{};
  static inline const char* name = "tpu_node";
};

using node_actor = caf::stateful_actor<node_state>;

std::string seconds_text(std::chrono::milliseconds d) {
  auto text = std::to_string(static_cast<double>(d.count()) / 1000.0);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.')
    text.pop_back();
  return text;
}

// The pool's budget for a request: what is left of its deadline plus a grace, so that the
// requester always hears the node's timeout first and the worker kills a hung candidate
// just after.
constexpr std::chrono::milliseconds worker_grace{1'000};

uint32_t budget_ms(node_actor* self, const pending_request& p) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - self->clock().now());
  return static_cast<uint32_t>(std::clamp<int64_t>((left + worker_grace).count(), 1, UINT32_MAX));
}

// Whether evaluations occupy a simulated device (model backend, simulate_device > 0).
bool simulated(node_actor* self) {
  return self->state.config.simulate_device.count() > 0 && self->state.config.backend == "model";
}

// The stored result of `p`, if any (counted as a cache hit).
std::optional<payload> stored_result(node_actor* self, const pending_request& p,
                                     const std::string& candidate_id) {
  auto* store = self->state.config.store;
  if (!store || p.key.empty())
    return std::nullopt;
  auto found = store->find(p.key);
  if (!found)
    return std::nullopt;
  std::string err;
  auto result = stamped_result(*found, p.key, true, candidate_id, err);
  if (!err.empty()) {
    ++self->state.store_errors;  // an unreadable record: evaluate afresh
    return std::nullopt;
  }
  ++self->state.cache_hits;
  return result;
}

// The stored result of `p`, if any, answered at once.
bool answer_from_store(node_actor* self, pending_request& p, const std::string& candidate_id) {
  auto result = stored_result(self, p, candidate_id);
  if (!result)
    return false;
  p.promise.deliver(std::move(*result));
  p.answered = true;
  return true;
}

// The simulated device runs one evaluation at a time: request `id` occupies it for
// simulate_device after the previous one, and its reply (`result`) waits for that.
void hold_device(node_actor* self, uint64_t id, payload result) {
  auto& st = self->state;
  auto now = self->clock().now();
  st.device_free = std::max(now, st.device_free) + st.config.simulate_device;
  st.pending.at(id).result = std::move(result);
  self->delayed_send(self, st.device_free - now, release_atom::value, id);
}

// On a simulated device a store hit is device work like any other evaluation (capacity
// planning must not depend on the cache): admitted request `id` takes its turn on the
// device with the stored result. False when nothing is stored for it.
bool hit_on_device(node_actor* self, uint64_t id, const std::string& candidate_id) {
  auto result = stored_result(self, self->state.pending.at(id), candidate_id);
  if (!result)
    return false;
  hold_device(self, id, std::move(*result));
  return true;
}

void finish(node_actor* self, uint64_t id) {
  self->state.pending.erase(id);
}

void on_result(node_actor* self, uint64_t id, payload& result);
void on_failure(node_actor* self, uint64_t id, caf::error& err);

// The request's spec with its shipped files written here and sourcePath naming them, for the
// worker; the store key was computed from the request as received. False with `why`.
template <class Request>
bool localize(node_actor* self, payload& bytes, std::string& why) {
  auto* shipped = self->state.config.shipped;
  if (!shipped)
    return true;
  try {
    auto msg = messages::decoded_message::parse(bytes.bytes, why);
    if (!msg)
      return false;
    auto request = msg->root<Request>();
    auto spec = request.getSpec();
    if (!spec.hasTaskFiles() || spec.getTaskFiles().size() == 0)
      return true;
    auto name = std::filesystem::path(spec.getSourcePath().cStr()).filename().string();
    auto dir = shipped->materialize(spec.getTaskFiles(), name, why);
    if (!dir) {
      why = std::string(spec.getName().cStr()) + ": " + why;
      return false;
    }
    capnp::MallocMessageBuilder copy;
    copy.setRoot(request);
    localize_spec(copy.getRoot<Request>().getSpec(), *dir);
    bytes = messages::make_payload<Request>(copy);
    return true;
  } catch (const kj::Exception& e) {
    why = std::string("malformed request: ") + e.getDescription().cStr();
    return false;
  }
}

void dispatch(node_actor* self, uint64_t id) {
  auto& p = self->state.pending.at(id);
  auto& pool = self->state.pool;
  std::string why;
  bool local = p.kind == request_kind::evaluate ? localize<schema::EvalRequest>(self, p.request, why)
               : p.kind == request_kind::analyze ? localize<schema::AnalyzeRequest>(self, p.request, why)
                                                 : true;
  if (!local) {
    if (!p.answered)
      p.promise.deliver(make_error(error_code::bad_input, why));
    finish(self, id);
    return;
  }
  auto budget = budget_ms(self, p);
  auto ok = [self, id](payload& result) { on_result(self, id, result); };
  auto fail = [self, id](caf::error& err) { on_failure(self, id, err); };
  switch (p.kind) {
    case request_kind::evaluate:
      self->request(pool, caf::infinite, messages::evaluate_atom::value, p.request, budget)
        .then(ok, fail);
      break;
    case request_kind::load:
      self->request(pool, caf::infinite, messages::load_atom::value, p.path, budget).then(ok, fail);
      break;
    case request_kind::analyze:
      self->request(pool, caf::infinite, messages::analyze_atom::value, p.request, budget)
        .then(ok, fail);
      break;
  }
}

void record(node_actor* self, const pending_request& p, const payload& result) {
  auto* store = self->state.config.store;
  if (!store || p.key.empty())
    return;
  std::string err;
  auto decoded = open_checked<schema::EvalResult>(result.bytes, err);
  if (!decoded)
    return;
  auto r = decoded->root<schema::EvalResult>();
  if (!recordable(r))
    return;
  if (!store->record(record_for(p.key, result.bytes, r, p.spec_name, p.chip), err))
    ++self->state.store_errors;
}

// `text` with the shipped directory named as its requester names it.
std::string requester_text(const pending_request& p, std::string text) {
  for (auto at = text.find(p.path); at != std::string::npos; at = text.find(p.path, at))
    text.replace(at, p.path.size(), p.shipped_from), at += p.shipped_from.size();
  return text;
}

// A KernelSpec loaded from shipped files, with the requester's paths (it reads the
// baseline from its own copy).
payload requester_paths(const pending_request& p, const payload& result) {
  std::string err;
  auto msg = messages::open_payload<schema::KernelSpec>(result, err);
  if (!msg)
    return result;
  capnp::MallocMessageBuilder copy;
  copy.setRoot(msg->root<schema::KernelSpec>());
  restore_spec_paths(copy.getRoot<schema::KernelSpec>(), p.path, p.shipped_from);
  return messages::make_payload<schema::KernelSpec>(copy);
}

void on_result(node_actor* self, uint64_t id, payload& result) {
  auto& st = self->state;
  auto it = st.pending.find(id);
  if (it == st.pending.end())
    return;
  auto& p = it->second;
  if (p.kind == request_kind::evaluate) {
    ++st.evaluations;
    std::string err;
    auto out = stamped_result(result.bytes, p.key, false, {}, err);
    if (!err.empty()) {
      if (!p.answered)
        p.promise.deliver(make_error(error_code::internal, "the pool sent a bad EvalResult: " + err));
      finish(self, id);
      return;
    }
    // Recorded before the reply: a repeat sent on receipt of the reply is a store hit.
    record(self, p, out);
    result = std::move(out);
    if (simulated(self)) {
      hold_device(self, id, std::move(result));
      return;
    }
  }
  if (p.kind == request_kind::load && !p.shipped_from.empty())
    result = requester_paths(p, result);
  if (!p.answered)
    p.promise.deliver(std::move(result));
  finish(self, id);
}

void on_failure(node_actor* self, uint64_t id, caf::error& err) {
  auto& st = self->state;
  auto it = st.pending.find(id);
  if (it == st.pending.end())
    return;
  if (!it->second.answered) {
    if (messages::code_of(err) == error_code::worker_timeout)
      ++st.timeouts;
    auto& p = it->second;
    if (p.kind == request_kind::load && !p.shipped_from.empty()) {
      auto text = messages::message_of(err);
      if (text.find(p.path) != std::string::npos)
        err = make_error(messages::code_of(err), requester_text(p, std::move(text)));
    }
    p.promise.deliver(std::move(err));
  }
  finish(self, id);
}

// The effective chip of a request: its options', else its spec's, else the node's. A device
// measures only itself, so on jax-tpu another chip is bad input.
bool resolve_chip(node_actor* self, schema::EvalRequest::Reader request, std::string& chip,
                  std::string& error) {
  chip = request.getOptions().getChip();
  if (chip.empty())
    chip = request.getSpec().getChip();
  if (chip.empty())
    chip = self->state.config.chip;
  if (self->state.config.backend == "jax-tpu" && chip != self->state.config.chip) {
    error = "node " + self->state.config.node_id + " is a " + self->state.config.chip
            + " device; the request asks for " + chip;
    return false;
  }
  return true;
}

// Accepts a request into the queue, or refuses it when the queue is full.
bool admit(node_actor* self, pending_request& p, std::chrono::milliseconds deadline,
           uint64_t& id) {
  auto& st = self->state;
  if (st.pending.size() >= st.config.queue_capacity) {
    ++st.refused;
    p.promise.deliver(make_error(
      error_code::overloaded, "node " + st.config.node_id + " has "
                                + std::to_string(st.pending.size())
                                + " requests in flight (capacity "
                                + std::to_string(st.config.queue_capacity) + ")"));
    return false;
  }
  id = st.next_id++;
  p.deadline = self->clock().now() + deadline;
  p.limit = deadline;
  self->delayed_send(self, deadline, deadline_atom::value, id);
  st.pending.emplace(id, std::move(p));
  return true;
}

void ask_version(node_actor* self);

void evaluate_checked(node_actor* self, pending_request& p, payload& bytes,
                      uint32_t deadline_ms) {
  auto& st = self->state;
  if (!st.misconfiguration.empty()) {
    p.promise.deliver(make_error(error_code::internal, st.misconfiguration));
    return;
  }
  std::string err;
  auto msg = open_checked<schema::EvalRequest>(bytes, err);
  if (!msg) {
    p.promise.deliver(make_error(error_code::malformed_message, "EvalRequest: " + err));
    return;
  }
  auto request = msg->root<schema::EvalRequest>();
  if (!resolve_chip(self, request, p.chip, err)) {
    p.promise.deliver(make_error(error_code::bad_input, err));
    return;
  }
  p.spec_name = request.getSpec().getName();
  std::string candidate_id = request.getCandidate().getId();
  if (!st.jax_version.empty()) {
    p.key = request_key(request, p.chip, st.config.backend, st.jax_version,
                        evaluator_revision(st.config.backend, p.chip));
    // Store hits are answered before anything else, even when the queue is full; on a
    // simulated device they queue for it (below).
    if (!simulated(self) && answer_from_store(self, p, candidate_id))
      return;
  }
  // The pool evaluates for the chip resolved here.
  if (request.getOptions().getChip() != p.chip) {
    capnp::MallocMessageBuilder copy;
    copy.setRoot(request);
    copy.getRoot<schema::EvalRequest>().getOptions().setChip(p.chip);
    p.request = messages::make_payload<schema::EvalRequest>(copy);
  } else {
    p.request = std::move(bytes);
  }
  auto deadline = deadline_ms > 0 ? std::chrono::milliseconds(deadline_ms)
                                  : st.config.default_deadline;
  uint64_t id = 0;
  if (!admit(self, p, deadline, id))
    return;
  if (st.jax_version.empty()) {
    st.waiting_version.push_back(id);
    ask_version(self);
  } else if (!simulated(self) || !hit_on_device(self, id, candidate_id)) {
    dispatch(self, id);
  }
}

caf::response_promise evaluate(node_actor* self, payload& bytes, uint32_t deadline_ms) {
  pending_request p;
  p.kind = request_kind::evaluate;
  p.promise = self->make_response_promise();
  auto rp = p.promise;
  try {
    evaluate_checked(self, p, bytes, deadline_ms);
  } catch (const kj::Exception& e) {
    // A field that did not read (the request was checked only for its pointers).
    if (p.promise.pending())
      p.promise.deliver(make_error(error_code::malformed_message,
                                   std::string("EvalRequest: ") + e.getDescription().cStr()));
  }
  return rp;
}

// The key needs the workers' JAX version; requests that arrive before a worker has started
// wait for it.
void on_version(node_actor* self, const std::string& jax_version, const std::string& backend) {
  auto& st = self->state;
  st.version_requested = false;
  if (backend != st.config.backend)
    st.misconfiguration = "node " + st.config.node_id + " is configured for the "
                          + st.config.backend + " backend but its worker pool runs " + backend;
  else
    st.jax_version = jax_version;
  auto waiting = std::move(st.waiting_version);
  st.waiting_version.clear();
  for (auto id : waiting) {
    auto it = st.pending.find(id);
    if (it == st.pending.end())
      continue;
    auto& p = it->second;
    if (p.answered) {  // timed out while waiting
      finish(self, id);
      continue;
    }
    if (!st.misconfiguration.empty()) {
      p.promise.deliver(make_error(error_code::internal, st.misconfiguration));
      finish(self, id);
      continue;
    }
    try {
      std::string err;
      auto msg = open_checked<schema::EvalRequest>(p.request, err);
      auto request = msg->root<schema::EvalRequest>();
      p.key = request_key(request, p.chip, st.config.backend, st.jax_version,
                        evaluator_revision(st.config.backend, p.chip));
      std::string candidate_id = request.getCandidate().getId().cStr();
      if (simulated(self)) {
        if (hit_on_device(self, id, candidate_id))
          continue;
      } else if (answer_from_store(self, p, candidate_id)) {
        finish(self, id);
        continue;
      }
    } catch (const kj::Exception& e) {
      p.promise.deliver(make_error(error_code::malformed_message,
                                   std::string("EvalRequest: ") + e.getDescription().cStr()));
      finish(self, id);
      continue;
    }
    dispatch(self, id);
  }
}

void on_version_error(node_actor* self, caf::error& err) {
  auto& st = self->state;
  st.version_requested = false;
  auto waiting = std::move(st.waiting_version);
  st.waiting_version.clear();
  for (auto id : waiting) {
    auto it = st.pending.find(id);
    if (it == st.pending.end())
      continue;
    if (!it->second.answered)
      it->second.promise.deliver(err);
    finish(self, id);
  }
}

void ask_version(node_actor* self) {
  auto& st = self->state;
  if (st.version_requested || !st.jax_version.empty())
    return;
  st.version_requested = true;
  self->request(st.pool, caf::infinite, messages::version_atom::value)
    .then([self](std::string& jax, std::string& backend) { on_version(self, jax, backend); },
          [self](caf::error& err) { on_version_error(self, err); });
}

caf::response_promise pass_through(node_actor* self, request_kind kind, payload request,
                                   std::string path, std::string shipped_from = {}) {
  pending_request p;
  p.kind = kind;
  p.promise = self->make_response_promise();
  auto rp = p.promise;
  p.request = std::move(request);
  p.path = std::move(path);
  p.shipped_from = std::move(shipped_from);
  uint64_t id = 0;
  if (admit(self, p, self->state.config.default_deadline, id))
    dispatch(self, id);
  return rp;
}

// A load with the task's files: written here (once per content), loaded from here.
caf::response_promise load_shipped(node_actor* self, const payload& request) {
  std::string why;
  auto msg = messages::open_payload<schema::LoadRequest>(request, why);
  if (!msg) {
    auto rp = self->make_response_promise();
    rp.deliver(make_error(error_code::malformed_message, "LoadRequest: " + why));
    return rp;
  }
  auto load = msg->root<schema::LoadRequest>();
  std::string path = load.getPath().cStr();
  auto* shipped = self->state.config.shipped;
  if (!shipped || load.getTaskFiles().size() == 0)
    return pass_through(self, request_kind::load, {}, std::move(path));
  auto dir = shipped->materialize(load.getTaskFiles(),
                                  std::filesystem::path(path).filename().string(), why);
  if (!dir) {
    auto rp = self->make_response_promise();
    rp.deliver(make_error(error_code::bad_input, path + ": " + why));
    return rp;
  }
  return pass_through(self, request_kind::load, {}, *dir, std::move(path));
}

void on_deadline(node_actor* self, uint64_t id) {
  auto& st = self->state;
  auto it = st.pending.find(id);
  if (it == st.pending.end() || it->second.answered)
    return;
  auto& p = it->second;
  ++st.timeouts;
  p.promise.deliver(make_error(error_code::worker_timeout,
                               "node " + st.config.node_id + ": no result within "
                                 + seconds_text(p.limit) + " s"));
  p.answered = true;
  // Still waiting for the version: nothing runs for it, so its slot is free at once.
  auto w = std::find(st.waiting_version.begin(), st.waiting_version.end(), id);
  if (w != st.waiting_version.end()) {
    st.waiting_version.erase(w);
    finish(self, id);
  }
}

void on_release(node_actor* self, uint64_t id) {
  auto& st = self->state;
  auto it = st.pending.find(id);
  if (it == st.pending.end())
    return;
  if (!it->second.answered)
    it->second.promise.deliver(std::move(it->second.result));
  finish(self, id);
}

payload node_info(node_actor* self, const payload* pool_info) {
  auto& st = self->state;
  capnp::MallocMessageBuilder msg;
  auto info = msg.initRoot<schema::NodeInfo>();
  std::string err;
  std::optional<messages::decoded_message> decoded;
  if (pool_info)
    decoded = messages::open_payload<schema::NodeInfo>(*pool_info, err);
  if (decoded) {
    auto from = decoded->root<schema::NodeInfo>();
    msg.setRoot(from);
    info = msg.getRoot<schema::NodeInfo>();
    info.setPoolQueueDepth(from.getQueueDepth());
  }
  info.setSchemaVersion(schema::SCHEMA_VERSION);
  info.setNodeId(st.config.node_id);
  info.setChip(st.config.chip);
  info.setBackend(st.config.backend);
  info.setDevice(st.config.device);
  info.setMaxkernelVersion(messages::maxkernel_version());
  info.setQueueDepth(static_cast<uint32_t>(st.pending.size()));
  info.setQueueCapacity(st.config.queue_capacity);
  info.setEvaluations(st.evaluations);
  info.setCacheHits(st.cache_hits);
  info.setTimeouts(st.timeouts);
  info.setRefused(st.refused);
  info.setSimulatedDeviceMs(static_cast<uint32_t>(st.config.simulate_device.count()));
  if (st.config.store)
    info.setStorePath(st.config.store->path());
  return messages::make_payload<schema::NodeInfo>(msg);
}

caf::behavior tpu_node(node_actor* self, node_config config, messages::worker_pool_actor pool) {
  auto& st = self->state;
  st.config = std::move(config);
  if (st.config.queue_capacity == 0)
    st.config.queue_capacity = 1;
  if (st.config.default_deadline.count() <= 0)
    st.config.default_deadline = node_config{}.default_deadline;
  st.pool = std::move(pool);
  ask_version(self);
  return {
    [self](messages::evaluate_atom, payload& request) { return evaluate(self, request, 0); },
    [self](messages::evaluate_atom, payload& request, uint32_t deadline_ms) {
      return evaluate(self, request, deadline_ms);
    },
    [self](messages::load_atom, std::string& path) {
      return pass_through(self, request_kind::load, {}, std::move(path));
    },
    [self](messages::load_atom, payload& request) { return load_shipped(self, request); },
    [self](messages::analyze_atom, payload& request) {
      if (request.type_id != capnp::typeId<schema::AnalyzeRequest>()) {
        auto rp = self->make_response_promise();
        rp.deliver(make_error(error_code::malformed_message, "expected an AnalyzeRequest"));
        return rp;
      }
      return pass_through(self, request_kind::analyze, std::move(request), {});
    },
    [self](messages::info_atom) {
      auto rp = self->make_response_promise();
      self->request(self->state.pool, caf::infinite, messages::info_atom::value)
        .then([self, rp](payload& pool_info) mutable { rp.deliver(node_info(self, &pool_info)); },
              [self, rp](caf::error&) mutable { rp.deliver(node_info(self, nullptr)); });
      return rp;
    },
    [self](deadline_atom, uint64_t id) { on_deadline(self, id); },
    [self](release_atom, uint64_t id) { on_release(self, id); },
  };
}

}  // namespace

messages::tpu_node_actor spawn_tpu_node(caf::actor_system& sys, node_config config,
                                        messages::worker_pool_actor pool) {
  // Dynamically typed inside (its timers are messages to itself), the typed interface
  // outside: a handle of this type is what gets published.
  auto node = sys.spawn(tpu_node, std::move(config), std::move(pool));
  return caf::actor_cast<messages::tpu_node_actor>(node);
}

}  // namespace maxkernel::tpu_nodes
