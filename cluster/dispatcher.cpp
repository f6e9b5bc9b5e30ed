#include "cluster/dispatcher.hpp"

#include "maxkernel/schema/cluster.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/sec.hpp>
#include <caf/stateful_actor.hpp>

#include <capnp/message.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace maxkernel::cluster {

namespace {

using messages::error_code;
using messages::make_error;
using messages::payload;
using clock_point = caf::actor_clock::time_point;
using std::chrono::milliseconds;

// The dispatcher's timers are messages to itself.
using straggler_atom = caf::atom_constant<caf::atom("straggler")>;
using expire_atom = caf::atom_constant<caf::atom("expire")>;
using unblock_atom = caf::atom_constant<caf::atom("unblock")>;

// One sending of a request to a node. A request has one, or two once a straggler copy went
// out; none while it is queued.
struct attempt {
  uint64_t id = 0;
  std::size_t node = 0;
  clock_point started{};
};

// An attempt that holds a credit at its node until the node answers or is lost. Its job may
// be gone already (a copy that lost the race).
struct attempt_ref {
  uint64_t job = 0;
  std::size_t node = 0;
  clock_point started{};
};

struct job {
  caf::response_promise promise;
  payload request;           // an EvalRequest; only its chip is read here
  std::string chip;          // the chip it asks for ("" : any)
  uint32_t deadline_ms = 0;  // 0: the node's default
  clock_point deadline{};    // when deadline_ms > 0, counted from our receipt
  std::vector<attempt> attempts;
  bool copied = false;       // a straggler copy went out (never more than one)
};

struct node_slot {
  messages::tpu_node_actor handle;
  caf::actor_addr addr;
  std::string node_id;       // "" until it described itself
  std::string chip;          // announced at join ("" : unknown, takes any request)
  std::string backend;       // model | jax-tpu ("" : unknown)
  bool alive = true;
  bool draining = false;     // an operator's drain: no new work, ever
  bool refusing = false;     // answered overloaded: no new work until one of ours finishes
  uint64_t refusals = 0;     // tells a stale unblock timer from the current one
  unsigned in_flight = 0;    // evaluation attempts out at it (copies included)
  // Load / analyze / info out at it, each with how to ask again elsewhere: a request sent to
  // a node that is then lost gets no answer (not even an error) before its own timeout.
  std::map<uint64_t, std::function<void()>> side;
  uint64_t completed = 0;    // answers it gave that were not refusals
};

struct dispatcher_state {
  dispatcher_config config;
  std::vector<node_slot> nodes;             // join order; never shrinks (index = identity)
  std::map<uint64_t, job> jobs;             // by arrival order
  std::deque<uint64_t> queue;               // jobs waiting for a credit, FIFO
  std::map<uint64_t, attempt_ref> live_attempts;  // each holds a credit at its node
  std::deque<milliseconds> durations;       // of the last completed evaluations
  uint64_t next_job = 1;
  uint64_t next_attempt = 1;
  uint64_t next_side = 1;
  uint64_t completed = 0;
  uint64_t redispatched = 0;
  uint64_t nodes_lost = 0;
  uint64_t orphaned = 0;
  uint64_t requeued = 0;
  std::vector<std::function<void()>> parked;  // load / analyze / info waiting for a node
  std::set<std::string> unserved;  // chips whose requests wait for a node (logged once)
  std::optional<clock_point> straggler_timer;  // when the pending straggler check fires
  uint64_t straggler_generation = 0;
  static inline const char* name = "dispatcher";
};

using dispatcher = caf::stateful_actor<dispatcher_state>;

std::string seconds_text(milliseconds d) {
  auto text = std::to_string(static_cast<double>(d.count()) / 1000.0);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.')
    text.pop_back();
  return text;
}

milliseconds since(clock_point from, clock_point to) {
  return std::chrono::duration_cast<milliseconds>(to - from);
}

// The node cannot be reached: the request timed out at the transport level or the node is
// gone. Everything else a node answers is its answer.
bool unreachable(const caf::error& err) {
  return err.category() == caf::atom("system")
         && (err.code() == static_cast<uint8_t>(caf::sec::request_timeout)
             || err.code() == static_cast<uint8_t>(caf::sec::request_receiver_down));
}

// Alive and not drained: it may get work.
bool usable(const node_slot& n) {
  return n.alive && !n.draining;
}

bool any_alive(const dispatcher_state& st) {
  return std::any_of(st.nodes.begin(), st.nodes.end(), [](auto& n) { return usable(n); });
}

// Whether node `n` may evaluate for `chip`: a device measures only its own chip; the model
// stands in for any; a node that did not say (joined without its NodeInfo) takes anything.
bool serves(const node_slot& n, const std::string& chip) {
  return chip.empty() || n.chip.empty() || n.backend == "model" || n.chip == chip;
}

// The chip an EvalRequest asks for: its options', else its spec's ("" : any, or unreadable;
// the node answers a malformed request itself).
std::string chip_of(const payload& request) {
  std::string err;
  auto msg = messages::decoded_message::parse(request.bytes, err);
  if (!msg)
    return {};
  try {
    auto r = msg->root<schema::EvalRequest>();
    std::string chip = r.getOptions().getChip().cStr();
    return chip.empty() ? std::string(r.getSpec().getChip().cStr()) : chip;
  } catch (const kj::Exception&) {
    return {};
  }
}

// The live node with a free credit that serves `chip` and holds the fewest evaluations,
// lowest index first.
std::optional<std::size_t> pick_node(const dispatcher_state& st,
                                     std::optional<std::size_t> exclude = {},
                                     const std::string& chip = {}) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < st.nodes.size(); ++i) {
    auto& n = st.nodes[i];
    if (!usable(n) || n.refusing || n.in_flight >= st.config.credits_per_node || exclude == i
        || !serves(n, chip))
      continue;
    if (!best || n.in_flight < st.nodes[*best].in_flight)
      best = i;
  }
  return best;
}

// Load and analyze: the first live node with a free credit, else the least loaded.
std::optional<std::size_t> side_node(const dispatcher_state& st) {
  if (auto free = pick_node(st))
    return free;
  // The least loaded, a refusing node only when every node refuses.
  std::optional<std::size_t> best;
  for (bool refusing_too : {false, true}) {
    for (std::size_t i = 0; i < st.nodes.size(); ++i) {
      auto& n = st.nodes[i];
      auto load = [](const node_slot& x) { return x.in_flight + x.side.size(); };
      if (usable(n) && (refusing_too || !n.refusing) && (!best || load(n) < load(st.nodes[*best])))
        best = i;
    }
    if (best)
      break;
  }
  return best;
}

// The node refuses work for now (overloaded, or no worker running): no new work until one of
// its requests finishes, or overload_retry after its last one did.
void refusing(dispatcher* self, std::size_t node) {
  auto& st = self->state;
  auto& n = st.nodes[node];
  n.refusing = true;
  ++n.refusals;
  if (n.in_flight == 0)
    self->delayed_send(self, st.config.overload_retry, unblock_atom::value,
                       static_cast<uint64_t>(node), n.refusals);
}

// Another node that may take a refused request.
bool another_taker(const dispatcher_state& st, std::size_t node) {
  for (std::size_t i = 0; i < st.nodes.size(); ++i)
    if (i != node && usable(st.nodes[i]) && !st.nodes[i].refusing)
      return true;
  return false;
}

std::optional<std::size_t> first_alive(const dispatcher_state& st) {
  for (std::size_t i = 0; i < st.nodes.size(); ++i)
    if (usable(st.nodes[i]))
      return i;
  return std::nullopt;
}

caf::error no_node_alive() {
  return make_error(error_code::worker_unavailable, "no TPU node is alive");
}

std::string node_id_of(const payload& info) {
  std::string err;
  auto msg = messages::open_payload<schema::NodeInfo>(info, err);
  if (!msg)
    return {};
  return msg->root<schema::NodeInfo>().getNodeId();
}

void dispatch(dispatcher* self);
void on_result(dispatcher* self, uint64_t attempt_id, std::size_t node, payload& result);
void on_error(dispatcher* self, uint64_t attempt_id, std::size_t node, caf::error& err);

void send_attempt(dispatcher* self, uint64_t job_id, std::size_t node) {
  auto& st = self->state;
  auto& j = st.jobs.at(job_id);
  auto& n = st.nodes[node];
  auto now = self->clock().now();
  auto aid = st.next_attempt++;
  j.attempts.push_back({aid, node, now});
  st.live_attempts.emplace(aid, attempt_ref{job_id, node, now});
  ++n.in_flight;
  auto ok = [self, aid, node](payload& result) { on_result(self, aid, node, result); };
  auto fail = [self, aid, node](caf::error& err) { on_error(self, aid, node, err); };
  if (j.deadline_ms > 0) {
    // The node gets what is left of the request's deadline.
    auto left = std::max<int64_t>(1, since(now, j.deadline).count());
    self->request(n.handle, milliseconds(left) + st.config.reply_margin,
                  messages::evaluate_atom::value, j.request, static_cast<uint32_t>(left))
      .then(ok, fail);
  } else {
    self->request(n.handle, st.config.default_deadline + st.config.reply_margin,
                  messages::evaluate_atom::value, j.request)
      .then(ok, fail);
  }
}

bool expired(dispatcher* self, const job& j) {
  return j.deadline_ms > 0 && self->clock().now() >= j.deadline;
}

void answer_expired(job& j) {
  j.promise.deliver(make_error(error_code::worker_timeout,
                               "no TPU node was free within "
                                 + seconds_text(milliseconds(j.deadline_ms)) + " s"));
}

// Jobs that lost their last attempt go back to the front of the queue, oldest first.
void requeue(dispatcher* self, std::vector<uint64_t> job_ids) {
  auto& st = self->state;
  std::sort(job_ids.begin(), job_ids.end());
  for (auto it = job_ids.rbegin(); it != job_ids.rend(); ++it) {
    auto& j = st.jobs.at(*it);
    if (expired(self, j)) {
      answer_expired(j);
      st.jobs.erase(*it);
      continue;
    }
    ++st.requeued;
    st.queue.push_front(*it);
  }
}

// Frees the attempt's credit. Returns the job it served while that is still unanswered
// (0 when a copy lost the race: its answer is dropped).
uint64_t release(dispatcher* self, uint64_t attempt_id) {
  auto& st = self->state;
  auto a = st.live_attempts.find(attempt_id);
  if (a == st.live_attempts.end())
    return 0;
  auto ref = a->second;
  st.live_attempts.erase(a);
  --st.nodes[ref.node].in_flight;
  auto j = st.jobs.find(ref.job);
  if (j == st.jobs.end())
    return 0;
  auto& attempts = j->second.attempts;
  attempts.erase(std::remove_if(attempts.begin(), attempts.end(),
                                [&](auto& x) { return x.id == attempt_id; }),
                 attempts.end());
  return ref.job;
}

// The node is gone (down, or a request to it timed out at the transport level): it gets no
// more work and what it held goes to the others.
void node_lost(dispatcher* self, std::size_t node) {
  auto& st = self->state;
  auto& n = st.nodes[node];
  if (!n.alive)
    return;
  n.alive = false;
  n.refusing = false;
  std::vector<uint64_t> orphans;
  for (auto it = st.live_attempts.begin(); it != st.live_attempts.end();) {
    if (it->second.node != node) {
      ++it;
      continue;
    }
    auto j = st.jobs.find(it->second.job);
    if (j != st.jobs.end()) {
      auto& attempts = j->second.attempts;
      auto id = it->first;
      attempts.erase(std::remove_if(attempts.begin(), attempts.end(),
                                    [&](auto& x) { return x.id == id; }),
                     attempts.end());
      if (attempts.empty())
        orphans.push_back(j->first);
    }
    it = st.live_attempts.erase(it);
  }
  n.in_flight = 0;
  ++st.nodes_lost;
  st.orphaned += orphans.size();
  requeue(self, std::move(orphans));
  // Its load / analyze / info go to another node now rather than at their timeout.
  auto side = std::exchange(n.side, {});
  for (auto& [id, again] : side)
    again();
}

// A node answered the job: the answer goes to the requester.
void finish(dispatcher* self, uint64_t job_id, std::size_t node, caf::expected<payload> answer,
            clock_point started) {
  auto& st = self->state;
  auto& j = st.jobs.at(job_id);
  auto& n = st.nodes[node];
  ++n.completed;
  n.refusing = false;  // one of its requests finished: it takes work again
  ++st.completed;
  if (answer) {
    st.durations.push_back(since(started, self->clock().now()));
    while (st.durations.size() > std::max<std::size_t>(1, st.config.straggler_window))
      st.durations.pop_front();
    j.promise.deliver(std::move(*answer));
  } else {
    j.promise.deliver(answer.error());
  }
  st.jobs.erase(job_id);
}

void on_result(dispatcher* self, uint64_t attempt_id, std::size_t node, payload& result) {
  auto& st = self->state;
  auto known = st.live_attempts.find(attempt_id);
  if (known == st.live_attempts.end())
    return;  // the node was taken as lost meanwhile; its work went elsewhere
  auto started = known->second.started;
  if (auto job_id = release(self, attempt_id)) {
    finish(self, job_id, node, std::move(result), started);
  } else {
    ++st.nodes[node].completed;
    st.nodes[node].refusing = false;
  }
  dispatch(self);
}

void on_error(dispatcher* self, uint64_t attempt_id, std::size_t node, caf::error& err) {
  auto& st = self->state;
  if (!st.live_attempts.count(attempt_id))
    return;  // the node was taken as lost meanwhile
  if (unreachable(err)) {
    // Its other work moves too; this attempt is one of those it held.
    node_lost(self, node);
    dispatch(self);
    return;
  }
  auto started = st.live_attempts.at(attempt_id).started;
  auto job_id = release(self, attempt_id);
  auto& n = st.nodes[node];
  // Overloaded, or no worker of its running (killed, restarting after a backoff): the node
  // refuses for now and the request goes to another node; the node gets work again when
  // one of its requests finishes or after overload_retry.
  auto code = messages::code_of(err);
  if (code == error_code::overloaded || code == error_code::worker_unavailable) {
    refusing(self, node);
    if (job_id && st.jobs.at(job_id).attempts.empty())
      requeue(self, {job_id});
  } else if (job_id) {
    finish(self, job_id, node, std::move(err), started);
  } else {
    ++n.completed;
    n.refusing = false;
  }
  dispatch(self);
}

milliseconds median_duration(const dispatcher_state& st) {
  std::vector<milliseconds> d(st.durations.begin(), st.durations.end());
  auto mid = d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2);
  std::nth_element(d.begin(), mid, d.end());
  return *mid;
}

// With the queue empty and a node idle: the longest-running request past the straggler
// threshold that has no copy yet goes again to an idle node. The check runs again when the
// next request would cross the threshold.
void copy_stragglers(dispatcher* self) {
  auto& st = self->state;
  if (st.durations.size() < std::max<std::size_t>(1, st.config.straggler_samples))
    return;
  auto scaled = std::chrono::duration_cast<milliseconds>(median_duration(st)
                                                         * st.config.straggler_factor);
  auto threshold = std::max(st.config.straggler_min, scaled);
  auto now = self->clock().now();
  auto next_check = clock_point::max();  // when the next request crosses the threshold
  for (;;) {
    if (!pick_node(st))
      return;  // nothing idle: a finishing request brings us back here
    uint64_t chosen = 0;
    clock_point oldest{};
    next_check = clock_point::max();
    for (auto& [id, j] : st.jobs) {
      if (j.copied || j.attempts.size() != 1 || expired(self, j))
        continue;
      auto& a = j.attempts.front();
      if (!pick_node(st, a.node, j.chip))
        continue;
      if (now - a.started >= threshold) {
        if (chosen == 0 || a.started < oldest) {
          chosen = id;
          oldest = a.started;
        }
      } else if (a.started + threshold < next_check) {
        next_check = a.started + threshold;
      }
    }
    if (chosen == 0)
      break;
    auto& j = st.jobs.at(chosen);
    auto target = *pick_node(st, j.attempts.front().node, j.chip);
    j.copied = true;
    ++st.redispatched;
    send_attempt(self, chosen, target);
  }
  if (next_check != clock_point::max()
      && (!st.straggler_timer || next_check < *st.straggler_timer)) {
    st.straggler_timer = next_check;
    self->delayed_send(self, next_check - now, straggler_atom::value,
                       ++st.straggler_generation);
  }
}

void log(dispatcher* self, const std::string& line) {
  if (self->state.config.log)
    self->state.config.log(line);
}

// Queued job `id` has no free node for its chip. When no usable node serves that chip at all,
// it waits for one to join (said once per chip); a dispatcher that does not wait for nodes
// answers it worker_unavailable. True when the job was answered (and is gone).
bool unserved(dispatcher* self, uint64_t id) {
  auto& st = self->state;
  auto& j = st.jobs.at(id);
  for (auto& n : st.nodes)
    if (usable(n) && serves(n, j.chip))
      return false;  // busy for now
  std::string joined;
  for (auto& n : st.nodes)
    if (usable(n))
      joined += (joined.empty() ? "" : ", ") + (n.chip.empty() ? "?" : n.chip) + " "
                + (n.backend.empty() ? "?" : n.backend);
  auto why = "no node serves chip " + j.chip + " (nodes: " + joined
             + "; a jax-tpu node measures only its own chip, a model node stands in for any)";
  if (!st.config.wait_for_nodes) {
    j.promise.deliver(make_error(error_code::worker_unavailable, why));
    st.jobs.erase(id);
    return true;
  }
  if (st.unserved.insert(j.chip).second)
    log(self, "requests for chip " + j.chip + " wait: " + why);
  return false;
}

void dispatch(dispatcher* self) {
  auto& st = self->state;
  if (!any_alive(st) && st.config.wait_for_nodes)
    return;  // queued requests wait for a node to join (or their deadline)
  if (!any_alive(st)) {
    for (auto id : st.queue) {
      st.jobs.at(id).promise.deliver(no_node_alive());
      st.jobs.erase(id);
    }
    st.queue.clear();
    return;
  }
  // FIFO among the requests a free node serves: one for a chip no free node serves keeps
  // its place and does not hold back those behind it.
  for (auto it = st.queue.begin(); it != st.queue.end() && pick_node(st);) {
    auto id = *it;
    auto& j = st.jobs.at(id);
    if (expired(self, j)) {
      answer_expired(j);
      st.jobs.erase(id);
      it = st.queue.erase(it);
      continue;
    }
    auto node = pick_node(st, {}, j.chip);
    if (!node) {
      if (!unserved(self, id))
        ++it;
      else
        it = st.queue.erase(it);
      continue;
    }
    it = st.queue.erase(it);
    send_attempt(self, id, *node);
  }
  copy_stragglers(self);
}

caf::response_promise evaluate(dispatcher* self, payload& request, uint32_t deadline_ms) {
  auto& st = self->state;
  auto rp = self->make_response_promise();
  if (!any_alive(st) && !st.config.wait_for_nodes) {
    rp.deliver(no_node_alive());
    return rp;
  }
  auto id = st.next_job++;
  job j;
  j.promise = rp;
  j.chip = chip_of(request);
  j.request = std::move(request);
  j.deadline_ms = deadline_ms;
  if (deadline_ms > 0) {
    j.deadline = self->clock().now() + milliseconds(deadline_ms);
    self->delayed_send(self, milliseconds(deadline_ms), expire_atom::value, id);
  }
  st.jobs.emplace(id, std::move(j));
  st.queue.push_back(id);
  dispatch(self);
  return rp;
}

// A queued request whose deadline passed before any node was free.
void on_expire(dispatcher* self, uint64_t id) {
  auto& st = self->state;
  auto q = std::find(st.queue.begin(), st.queue.end(), id);
  if (q == st.queue.end())
    return;  // answered, or at a node (which keeps the deadline itself)
  st.queue.erase(q);
  answer_expired(st.jobs.at(id));
  st.jobs.erase(id);
}

// Load and analyze: how many times a worker may die under one before its death is the
// task's (a reference that kills every worker) rather than the host's (a killed process).
constexpr unsigned side_crashes_tolerated = 2;

// Load, analyze, info: one node answers; a node that cannot be reached is taken as lost
// and the next one is asked (info only when the node is gone, not when it is slow).
template <class... Ts>
void forward(dispatcher* self, caf::response_promise rp, bool first, milliseconds timeout,
             unsigned crashes, Ts... args) {
  auto& st = self->state;
  auto node = first ? first_alive(st) : side_node(st);
  if (!node && st.config.wait_for_nodes) {
    // Asked again when a node joins; the requester's own timeout bounds the wait.
    st.parked.push_back([self, rp, first, timeout, crashes, args...]() mutable {
      forward(self, rp, first, timeout, crashes, args...);
    });
    return;
  }
  if (!node) {
    rp.deliver(no_node_alive());
    return;
  }
  auto i = *node;
  auto id = st.next_side++;
  st.nodes[i].side.emplace(id, [self, rp, first, timeout, crashes, args...]() mutable {
    forward(self, rp, first, timeout, crashes, args...);
  });
  // Whether the request is still this node's: false once the node was lost and the request
  // went on elsewhere (this late answer is then dropped).
  auto settle = [self, i, id] { return self->state.nodes[i].side.erase(id) > 0; };
  self->request(st.nodes[i].handle, timeout, args...)
    .then(
      [self, rp, i, first, settle](payload& reply) mutable {
        if (!settle())
          return;
        auto& n = self->state.nodes[i];
        if (first)  // info: the node described itself
          if (auto id = node_id_of(reply); !id.empty())
            n.node_id = std::move(id);
        rp.deliver(std::move(reply));
      },
      [self, rp, i, first, timeout, crashes, settle, args...](caf::error& err) mutable {
        if (!settle())
          return;
        auto code = messages::code_of(err);
        if ((code == error_code::overloaded || code == error_code::worker_unavailable)
            && another_taker(self->state, i)) {
          // Full, or no worker running there (killed, restarting): another node takes it.
          refusing(self, i);
          forward(self, rp, first, timeout, crashes, args...);
          return;
        }
        if (code == error_code::worker_crashed && !first && crashes < side_crashes_tolerated) {
          // The worker died under the reference: asked again, on another node when there is
          // one (this one restarts its worker meanwhile).
          if (another_taker(self->state, i))
            refusing(self, i);
          forward(self, rp, first, timeout, crashes + 1, args...);
          return;
        }
        if (!unreachable(err)) {
          rp.deliver(std::move(err));
          return;
        }
        if (first && err.code() == static_cast<uint8_t>(caf::sec::request_timeout)) {
          // A slow description is no sign of a lost node: evaluations tell that.
          rp.deliver(make_error(error_code::worker_timeout,
                                "node " + std::to_string(i) + " did not describe itself within "
                                  + seconds_text(timeout) + " s"));
          return;
        }
        node_lost(self, i);
        dispatch(self);
        forward(self, rp, first, timeout, crashes, args...);
      });
}

// What a node announced at its join (NodeInfo): its chip and backend, its id.
struct announced {
  std::string node_id, chip, backend;
};

announced announced_of(const payload& info) {
  announced a;
  std::string err;
  auto msg = messages::open_payload<schema::NodeInfo>(info, err);
  if (!msg)
    return a;
  auto r = msg->root<schema::NodeInfo>();
  a.node_id = r.getNodeId().cStr();
  a.chip = r.getChip().cStr();
  a.backend = r.getBackend().cStr();
  return a;
}

void add_node(dispatcher* self, messages::tpu_node_actor handle, const announced& said = {}) {
  auto& st = self->state;
  if (!handle)
    return;
  auto addr = handle.address();
  if (!said.chip.empty()) {
    // Requests for chips it serves no longer wait for a node (a later wait is told again).
    for (auto it = st.unserved.begin(); it != st.unserved.end();)
      it = (said.backend == "model" || *it == said.chip) ? st.unserved.erase(it) : std::next(it);
  }
  for (std::size_t i = 0; i < st.nodes.size(); ++i) {
    auto& n = st.nodes[i];
    if (n.addr == addr) {
      if (!said.chip.empty()) {
        n.chip = said.chip;
        n.backend = said.backend;
      }
      if (n.addr.get() != addr.get()) {
        // It joins again through a new proxy: its connection dropped (and was made again),
        // which killed the old proxy and what was sent to it. Its work moves on, if the old
        // proxy's down_msg has not done that yet; it is sent to and watched through the new
        // one (sent to the old one, requests vanish; unwatched, its next loss goes unseen).
        node_lost(self, i);
        n.handle = handle;
        n.addr = addr;
        self->monitor(handle);
      }
      if (!n.alive) {  // back after it was taken as lost
        n.alive = true;
        n.in_flight = 0;
        n.refusing = false;
      }
      return;
    }
  }
  node_slot n;
  n.handle = handle;
  n.addr = addr;
  n.node_id = said.node_id;
  n.chip = said.chip;
  n.backend = said.backend;
  st.nodes.push_back(std::move(n));
  self->monitor(handle);
  auto i = st.nodes.size() - 1;
  // Its nodeId for the status; a node that does not describe itself still gets work.
  self->request(handle, st.config.info_timeout, messages::info_atom::value)
    .then(
      [self, i](payload& info) {
        if (auto id = node_id_of(info); !id.empty())
          self->state.nodes[i].node_id = std::move(id);
      },
      [](caf::error&) {});
}

// A node joined: what waited for one goes on.
void resume_parked(dispatcher* self) {
  auto parked = std::move(self->state.parked);
  self->state.parked.clear();
  for (auto& resume : parked)
    resume();
  dispatch(self);
}

payload status(dispatcher* self) {
  auto& st = self->state;
  capnp::MallocMessageBuilder msg;
  auto s = msg.initRoot<schema::DispatcherStatus>();
  s.setSchemaVersion(schema::SCHEMA_VERSION);
  auto nodes = s.initNodes(static_cast<unsigned>(st.nodes.size()));
  for (unsigned i = 0; i < st.nodes.size(); ++i) {
    auto& n = st.nodes[i];
    auto out = nodes[i];
    out.setIndex(i);
    out.setNodeId(n.node_id);
    out.setInFlight(n.in_flight);
    out.setCredits(st.config.credits_per_node);
    out.setCompleted(n.completed);
    out.setAlive(n.alive);
    out.setDraining(n.draining);
    out.setChip(n.chip);
    out.setBackend(n.backend);
  }
  s.setQueued(static_cast<uint32_t>(st.queue.size()));
  s.setInFlight(static_cast<uint32_t>(std::count_if(
    st.jobs.begin(), st.jobs.end(), [](auto& kv) { return !kv.second.attempts.empty(); })));
  s.setCompleted(st.completed);
  s.setRedispatched(st.redispatched);
  s.setNodesLost(st.nodes_lost);
  s.setOrphaned(st.orphaned);
  s.setRequeued(st.requeued);
  return messages::make_payload<schema::DispatcherStatus>(msg);
}

caf::behavior dispatcher_behavior(dispatcher* self, std::vector<messages::tpu_node_actor> nodes,
                                  dispatcher_config config) {
  auto& st = self->state;
  if (config.credits_per_node == 0)
    config.credits_per_node = 1;
  st.config = config;
  for (auto& n : nodes)
    add_node(self, std::move(n));
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    // The same proxy, not only the same actor: a node that joined again since has a new one.
    for (std::size_t i = 0; i < st.nodes.size(); ++i)
      if (st.nodes[i].addr.get() == dm.source.get())
        node_lost(self, i);
    dispatch(self);
  });
  return {
    [self](messages::evaluate_atom, payload& request) { return evaluate(self, request, 0); },
    [self](messages::evaluate_atom, payload& request, uint32_t deadline_ms) {
      return evaluate(self, request, deadline_ms);
    },
    [self](messages::load_atom, std::string& path) {
      auto rp = self->make_response_promise();
      auto& c = self->state.config;
      forward(self, rp, false, c.default_deadline + c.reply_margin, 0u,
              messages::load_atom::value, std::move(path));
      return rp;
    },
    [self](messages::load_atom, payload& request) {
      auto rp = self->make_response_promise();
      auto& c = self->state.config;
      forward(self, rp, false, c.default_deadline + c.reply_margin, 0u,
              messages::load_atom::value, std::move(request));
      return rp;
    },
    [self](messages::analyze_atom, payload& request) {
      auto rp = self->make_response_promise();
      auto& c = self->state.config;
      forward(self, rp, false, c.default_deadline + c.reply_margin, 0u,
              messages::analyze_atom::value, std::move(request));
      return rp;
    },
    [self](messages::info_atom) {
      auto rp = self->make_response_promise();
      forward(self, rp, true, self->state.config.info_timeout, 0u, messages::info_atom::value);
      return rp;
    },
    [self](messages::status_atom) { return status(self); },
    [self](messages::join_atom, caf::actor& node) {
      add_node(self, caf::actor_cast<messages::tpu_node_actor>(node));
      resume_parked(self);
    },
    [self](messages::join_atom, caf::actor& node, payload& info) {
      add_node(self, caf::actor_cast<messages::tpu_node_actor>(node), announced_of(info));
      resume_parked(self);
    },
    [self](messages::drain_atom, uint32_t index) {
      auto& st = self->state;
      if (index >= st.nodes.size())
        return false;
      st.nodes[index].draining = true;
      dispatch(self);
      return true;
    },
    [self](straggler_atom, uint64_t generation) {
      auto& st = self->state;
      if (generation != st.straggler_generation)
        return;  // superseded by an earlier check
      st.straggler_timer.reset();
      dispatch(self);
    },
    [self](expire_atom, uint64_t id) { on_expire(self, id); },
    [self](unblock_atom, uint64_t node, uint64_t refusals) {
      auto& n = self->state.nodes[node];
      if (n.refusing && n.refusals == refusals && n.in_flight == 0) {
        n.refusing = false;
        dispatch(self);
      }
    },
  };
}

}  // namespace

messages::dispatcher_actor spawn_dispatcher(caf::actor_system& sys,
                                            std::vector<messages::tpu_node_actor> nodes,
                                            dispatcher_config config) {
  // Dynamically typed inside (its timers are messages to itself), the typed interface
  // outside.
  auto d = sys.spawn(dispatcher_behavior, std::move(nodes), config);
  return caf::actor_cast<messages::dispatcher_actor>(d);
}

}  // namespace maxkernel::cluster
