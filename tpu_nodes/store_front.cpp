#include "tpu_nodes/store_front.hpp"

#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "search/evaluation_store.hpp"
#include "tpu_nodes/checked_payload.hpp"
#include "tpu_nodes/evaluator_revision.hpp"
#include "tpu_nodes/request_key.hpp"
#include "tpu_nodes/store_policy.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <functional>
#include <vector>

namespace maxkernel::tpu_nodes {

namespace {

using messages::payload;
using std::chrono::milliseconds;

struct front_state {
  store_front_config config;
  messages::tpu_node_actor inner;
  // What the nodes behind run: part of every key. Learnt from the first node that describes
  // itself; evaluations wait for it (a restarted supervisor must not send again what its
  // store holds). If no node can say, they go on without a lookup.
  std::string jax_version;
  std::string backend;
  bool asking = false;
  std::vector<std::function<void()>> waiting;
  uint64_t hits = 0;
  uint64_t misses = 0;
  static inline const char* name = "store_front";
};

using front_actor = caf::stateful_actor<front_state>;

void release_waiting(front_actor* self) {
  auto waiting = std::move(self->state.waiting);
  self->state.waiting.clear();
  for (auto& go : waiting)
    go();
}

void learn_version(front_actor* self) {
  auto& st = self->state;
  if (!st.jax_version.empty() || st.asking)
    return;
  st.asking = true;
  // The dispatcher keeps the question until a node has joined.
  self->request(st.inner, st.config.default_deadline, messages::info_atom::value)
    .then(
      [self](payload& p) {
        auto& st = self->state;
        st.asking = false;
        std::string error;
        try {
          auto msg = open_checked<schema::NodeInfo>(p.bytes, error);
          if (msg) {
            auto info = msg->root<schema::NodeInfo>();
            st.jax_version = info.getJaxVersion().cStr();
            st.backend = info.getBackend().cStr();
          }
        } catch (const kj::Exception&) {
        }
        release_waiting(self);
      },
      [self](caf::error&) {
        self->state.asking = false;
        release_waiting(self);
      });
}

// The request's key, once the version is known ("" before, or for a request that cannot be
// read: the inner node answers that one).
std::string key_of(front_actor* self, const payload& request, std::string& candidate_id) {
  auto& st = self->state;
  if (st.jax_version.empty())
    return {};
  try {
    std::string error;
    auto msg = open_checked<schema::EvalRequest>(request.bytes, error);
    if (!msg)
      return {};
    auto r = msg->root<schema::EvalRequest>();
    candidate_id = r.getCandidate().getId().cStr();
    std::string chip = r.getOptions().getChip().cStr();
    return request_key(r, chip, st.backend, st.jax_version, evaluator_revision(st.backend, chip));
  } catch (const kj::Exception&) {
    return {};
  }
}

void record(front_actor* self, const payload& result, const payload& request) {
  auto* store = self->state.config.store;
  try {
    std::string error;
    auto msg = open_checked<schema::EvalResult>(result.bytes, error);
    if (!msg)
      return;
    auto r = msg->root<schema::EvalResult>();
    if (r.getCached() || r.getKey().size() == 0 || !recordable(r))
      return;
    auto req = open_checked<schema::EvalRequest>(request.bytes, error);
    if (!req)
      return;
    auto q = req->root<schema::EvalRequest>();
    store->record(record_for(r.getKey().cStr(), result.bytes, r, q.getSpec().getName().cStr(),
                             q.getOptions().getChip().cStr()),
                  error);
  } catch (const kj::Exception&) {
    // An unreadable result is still the node's answer; it is just not kept.
  }
}

void answer(front_actor* self, caf::response_promise rp, payload request, uint32_t deadline_ms) {
  auto& st = self->state;
  std::string candidate_id;
  auto key = key_of(self, request, candidate_id);
  if (!key.empty() && st.config.store) {
    if (auto found = st.config.store->find(key)) {
      std::string error;
      auto answer = stamped_result(*found, key, true, candidate_id, error);
      if (error.empty()) {
        ++st.hits;
        rp.deliver(std::move(answer));
        return;
      }
    }
  }
  ++st.misses;
  auto limit = deadline_ms > 0 ? milliseconds(deadline_ms) : st.config.default_deadline;
  self->request(st.inner, limit + st.config.reply_margin, messages::evaluate_atom::value,
                request, deadline_ms)
    .then(
      [self, rp, request](payload& result) mutable {
        if (self->state.config.store)
          record(self, result, request);  // before the reply: a repeat is a hit
        rp.deliver(std::move(result));
      },
      [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
}

caf::response_promise evaluate(front_actor* self, payload& request, uint32_t deadline_ms) {
  auto rp = self->make_response_promise();
  if (!self->state.jax_version.empty()) {
    answer(self, rp, std::move(request), deadline_ms);
    return rp;
  }
  self->state.waiting.push_back([self, rp, request, deadline_ms]() mutable {
    answer(self, rp, std::move(request), deadline_ms);
  });
  learn_version(self);
  return rp;
}

template <class... Ts>
caf::response_promise pass(front_actor* self, milliseconds timeout, Ts... args) {
  auto rp = self->make_response_promise();
  self->request(self->state.inner, timeout, args...)
    .then([rp](payload& reply) mutable { rp.deliver(std::move(reply)); },
          [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
  return rp;
}

// Dynamically typed inside (like tpu_node), the typed interface outside.
caf::behavior front_behavior(front_actor* self, store_front_config config,
                             messages::tpu_node_actor inner) {
  self->state.config = config;
  self->state.inner = std::move(inner);
  auto side = config.default_deadline + config.reply_margin;
  return {
    [self](messages::evaluate_atom, payload& request) { return evaluate(self, request, 0); },
    [self](messages::evaluate_atom, payload& request, uint32_t deadline_ms) {
      return evaluate(self, request, deadline_ms);
    },
    [self, side](messages::load_atom, std::string& path) {
      return pass(self, side, messages::load_atom::value, std::move(path));
    },
    [self, side](messages::load_atom, payload& request) {
      return pass(self, side, messages::load_atom::value, std::move(request));
    },
    [self, side](messages::analyze_atom, payload& request) {
      return pass(self, side, messages::analyze_atom::value, std::move(request));
    },
    [self](messages::info_atom) {
      return pass(self, self->state.config.reply_margin, messages::info_atom::value);
    },
  };
}

}  // namespace

messages::tpu_node_actor spawn_store_front(caf::actor_system& sys, store_front_config config,
                                           messages::tpu_node_actor inner) {
  auto front = sys.spawn(front_behavior, config, std::move(inner));
  return caf::actor_cast<messages::tpu_node_actor>(front);
}

}  // namespace maxkernel::tpu_nodes
