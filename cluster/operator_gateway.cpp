#include "cluster/operator_gateway.hpp"

#include "cluster/cluster_credentials.hpp"
#include "cluster/secure_transport.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/operator.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <capnp/message.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace maxkernel::cluster {

namespace {

using messages::error_code;
using messages::make_error;
using messages::payload;
using namespace std::chrono_literals;

// From the I/O thread to the actor: a shell's message (identity, body, frame count), and a
// shell that fell silent for the liveness period.
using frame_atom = caf::atom_constant<caf::atom("opframe")>;
using expire_atom = caf::atom_constant<caf::atom("opexpire")>;

// The sockets. The ROUTER and the thread's end of the inproc pair belong to the I/O thread;
// the actor's end to the actor. The context is declared first so it is destroyed last,
// after every socket is closed.
struct gateway_io {
  zmq::context_t context{1};
  std::unique_ptr<curve_server_auth> auth;  // the ZAP handler, with a cluster's credentials
  zmq::socket_t router;
  zmq::socket_t to_thread;   // actor side: [identity, bytes] to send, or [stop]
  zmq::socket_t from_actor;  // thread side
  std::chrono::milliseconds liveness{5000};
  std::atomic<bool> stop{false};
};

constexpr const char* inproc_endpoint = "inproc://operator-gateway";  // private to the context

// The thread: moves frames between the ROUTER and the actor, and notices silent shells.
// It holds the actor only weakly, so the actor's lifetime is not tied to it.
void run_io(std::shared_ptr<gateway_io> io, caf::actor_addr gateway) {
  using clock = std::chrono::steady_clock;
  auto tell = [&gateway](auto&&... xs) {
    auto hdl = caf::actor_cast<caf::actor>(gateway);
    if (!hdl)
      return false;
    caf::anon_send(hdl, std::forward<decltype(xs)>(xs)...);
    return true;
  };
  std::map<std::string, clock::time_point> last_seen;
  auto tick = std::clamp<std::chrono::milliseconds>(io->liveness / 4, 5ms, 100ms);
  bool running = true;
  while (running && !io->stop.load()) {
    zmq::pollitem_t items[] = {{io->router.handle(), 0, ZMQ_POLLIN, 0},
                               {io->from_actor.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, tick);
    } catch (const zmq::error_t&) {
      continue;  // EINTR
    }
    // Actor -> shells, in the order the actor sent them (the stop comes after the last words).
    while (running) {
      std::vector<zmq::message_t> parts;
      std::optional<size_t> n;
      try {
        n = zmq::recv_multipart(io->from_actor, std::back_inserter(parts),
                                zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        n.reset();
      }
      if (!n)
        break;
      if (parts.size() != 2) {
        running = false;
        break;
      }
      try {
        // A shell that is gone (ROUTER_MANDATORY) or not reading (high-water mark) misses it.
        io->router.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        io->router.send(parts[1], zmq::send_flags::dontwait);
      } catch (const zmq::error_t&) {
      }
    }
    auto now = clock::now();
    // Shells -> actor.
    for (int i = 0; running && i < 256; ++i) {
      std::vector<zmq::message_t> parts;
      std::optional<size_t> n;
      try {
        n = zmq::recv_multipart(io->router, std::back_inserter(parts), zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        n.reset();
      }
      if (!n)
        break;
      if (parts.size() < 2)
        continue;
      auto id = parts[0].to_string();
      last_seen[id] = now;
      auto frames = static_cast<uint32_t>(parts.size() - 1);
      if (!tell(frame_atom::value, id, parts[1].to_string(), frames))
        running = false;
    }
    for (auto it = last_seen.begin(); it != last_seen.end();) {
      if (now - it->second > io->liveness) {
        tell(expire_atom::value, it->first);
        it = last_seen.erase(it);
      } else {
        ++it;
      }
    }
  }
  // A short linger lets the last events (the end) reach the shells.
  io->router.set(zmq::sockopt::linger, 200);
  io->router.close();
  io->from_actor.close();
}

struct waiting_proposal {
  uint32_t seq = 0;
  std::string event;  // the OperatorEvent{proposal}, sent again to late shells
  caf::response_promise promise;
};

struct gateway_state {
  std::shared_ptr<gateway_io> io;
  std::thread thread;
  std::string welcome;
  std::map<std::string, std::string> shells;  // ZeroMQ identity -> operator name
  std::optional<waiting_proposal> waiting;
  // The shell that holds the hitl floor ("" : free). Several shells may watch; one decides
  // at a time so that two operators never answer proposals in turn without knowing it.
  std::string floor;
  bool ended = false;  // an `ended` went out

  // The floor goes free when its holder detaches, is detached for silence, or releases it.
  void free_floor(const std::string& identity, const std::string& why) {
    if (floor.empty() || floor != identity)
      return;
    auto it = shells.find(identity);
    std::string name = it == shells.end() ? "the operator" : it->second;
    floor.clear();
    broadcast(make_floor_notice("the hitl floor is free: " + name + " " + why));
  }
  static std::string make_floor_notice(const std::string& text);

  void send_to(const std::string& identity, const std::string& bytes) {
    try {
      io->to_thread.send(zmq::buffer(identity), zmq::send_flags::sndmore);
      io->to_thread.send(zmq::buffer(bytes), zmq::send_flags::none);
    } catch (const zmq::error_t&) {
    }
  }
  void broadcast(const std::string& bytes) {
    for (auto& [id, name] : shells)
      send_to(id, bytes);
  }

  ~gateway_state();
  static inline const char* name = "operator_gateway";
};

template <class Fill>
std::string make_event(Fill fill) {
  capnp::MallocMessageBuilder msg;
  auto ev = msg.initRoot<schema::OperatorEvent>();
  ev.setSchemaVersion(schema::SCHEMA_VERSION);
  fill(ev);
  return messages::encode(msg);
}

std::string refused_event(const std::string& why) {
  return make_event([&](auto ev) { ev.setRefused(why); });
}

std::string gateway_state::make_floor_notice(const std::string& text) {
  return make_event([&](auto ev) { ev.setNotice(text); });
}

gateway_state::~gateway_state() {
  if (waiting && waiting->promise.pending())
    waiting->promise.deliver(make_error(error_code::internal, "the operator gateway stopped"));
  if (!io)
    return;
  if (!ended)
    broadcast(make_event([](auto ev) { ev.setEnded("the operator gateway stopped"); }));
  try {
    io->to_thread.send(zmq::str_buffer("stop"), zmq::send_flags::none);
  } catch (const zmq::error_t&) {
  }
  io->stop = true;
  if (thread.joinable()) {
    // The thread itself may have dropped the last reference to the actor.
    if (thread.get_id() == std::this_thread::get_id())
      thread.detach();
    else
      thread.join();
  }
  io->to_thread.close();
}

using gateway = caf::stateful_actor<gateway_state>;

std::string trimmed(std::string s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos)
    return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Why a decision cannot be carried out as it stands; "" when it can.
std::string check_decision(schema::Decision::Reader d) {
  switch (d.getKind()) {
    case schema::DecisionKind::APPROVE:
    case schema::DecisionKind::REJECT:  // the feedback may be empty
    case schema::DecisionKind::STOP:
      return {};
    case schema::DecisionKind::EDIT: {
      auto changes = d.getChanges();
      bool has_source = !trimmed(d.getSource()).empty();
      if (changes.size() == 0 && !has_source)
        return "edit needs parameter changes or a source";
      if (changes.size() > 0 && has_source)
        return "edit gives parameter changes or a source, not both";
      for (auto c : changes) {
        std::string name = c.getName();
        std::string value = c.getValue();
        if (trimmed(name).empty())
          return "edit: a change has no parameter name";
        if (!nlohmann::json::accept(value))
          return "edit: the value of " + name + " is not a JSON literal: " + value;
      }
      return {};
    }
    case schema::DecisionKind::HINT:
      return trimmed(d.getText()).empty() ? "hint needs a text" : "";
    case schema::DecisionKind::TAKE_OVER:
      return trimmed(d.getSource()).empty() ? "takeover needs the kernel's source" : "";
    case schema::DecisionKind::HAND_OVER:
      return d.getSteps() == 0 ? "handover needs steps >= 1" : "";
  }
  return "unknown decision kind " + std::to_string(static_cast<unsigned>(d.getKind()));
}

void on_decision(gateway* self, const std::string& id, const std::string& name,
                 schema::Decision::Reader d) {
  auto& st = self->state;
  auto seq = d.getSeq();
  if (!st.waiting) {
    st.send_to(id, refused_event("decision #" + std::to_string(seq) + ": no proposal is waiting"));
    return;
  }
  if (seq != st.waiting->seq) {
    st.send_to(id, refused_event("decision #" + std::to_string(seq) + ": the waiting proposal is #"
                                 + std::to_string(st.waiting->seq)));
    return;
  }
  if (!st.floor.empty() && st.floor != id) {
    auto holder = st.shells.find(st.floor);
    st.send_to(id, refused_event(
                     "decision #" + std::to_string(seq) + ": "
                     + (holder == st.shells.end() ? std::string("another shell") : holder->second)
                     + " holds the hitl floor (one operator decides at a time; it is free once "
                       "they release it or detach)"));
    return;
  }
  if (auto why = check_decision(d); !why.empty()) {
    st.send_to(id, refused_event("decision #" + std::to_string(seq) + ": " + why));
    return;
  }
  st.floor = id;  // the first decision takes a free floor
  capnp::MallocMessageBuilder msg;
  msg.setRoot(d);
  auto copy = msg.getRoot<schema::Decision>();
  copy.setSchemaVersion(schema::SCHEMA_VERSION);
  if (trimmed(copy.asReader().getOperator()).empty())
    copy.setOperator(name);
  auto answer = messages::make_payload<schema::Decision>(msg);
  st.waiting->promise.deliver(answer);
  st.waiting.reset();
  st.broadcast(make_event([&](auto ev) { ev.setDecided(copy.asReader()); }));
}

void on_frame(gateway* self, const std::string& id, const std::string& body, uint32_t frames) {
  auto& st = self->state;
  if (frames != 1) {
    st.send_to(id, refused_event("malformed command: one Cap'n Proto message per frame, got "
                                 + std::to_string(frames) + " frames"));
    return;
  }
  std::string err;
  auto msg = messages::decode<schema::OperatorCommand>(body, err);
  if (!msg) {
    st.send_to(id, refused_event("malformed command: " + err));
    return;
  }
  auto cmd = msg->root<schema::OperatorCommand>();
  auto which = cmd.which();
  if (which == schema::OperatorCommand::ATTACH) {
    auto name = trimmed(cmd.getAttach());
    if (name.empty()) {
      st.send_to(id, refused_event("attach needs the operator's name"));
      return;
    }
    st.shells[id] = name;
    st.send_to(id, make_event([&](auto ev) { ev.setWelcome(st.welcome); }));
    if (st.waiting)
      st.send_to(id, st.waiting->event);
    return;
  }
  auto shell = st.shells.find(id);
  if (shell == st.shells.end()) {
    st.send_to(id, refused_event("attach first"));
    return;
  }
  switch (which) {
    case schema::OperatorCommand::PING:
      st.send_to(id, make_event([](auto ev) { ev.setPong(); }));
      return;
    case schema::OperatorCommand::DETACH:
      st.free_floor(id, "detached");
      st.shells.erase(id);
      return;
    case schema::OperatorCommand::RELEASE:
      if (st.floor != id) {
        st.send_to(id, refused_event("release: this shell does not hold the hitl floor"));
        return;
      }
      st.free_floor(id, "released it");
      return;
    case schema::OperatorCommand::DECISION:
      on_decision(self, id, shell->second, cmd.getDecision());
      return;
    default:
      st.send_to(id, refused_event("unknown command"));
  }
}

caf::behavior gateway_behavior(gateway* self, std::shared_ptr<gateway_io> io,
                               std::string welcome) {
  auto& st = self->state;
  st.io = io;
  st.welcome = std::move(welcome);
  st.thread = std::thread(run_io, io, self->address());
  return {
    [self](messages::propose_atom, const payload& p) -> caf::result<payload> {
      auto& st = self->state;
      std::string err;
      auto msg = messages::open_payload<schema::Proposal>(p, err);
      if (!msg)
        return make_error(error_code::malformed_message, "proposal: " + err);
      auto proposal = msg->root<schema::Proposal>();
      auto seq = proposal.getSeq();
      if (proposal.getAutoSteps() > 0)
        return make_error(error_code::bad_input,
                          "proposal #" + std::to_string(seq)
                            + " is handed over to auto: send it as a notice (notify)");
      if (st.waiting)
        return make_error(error_code::bad_input,
                          "proposal #" + std::to_string(seq) + " while proposal #"
                            + std::to_string(st.waiting->seq) + " waits for a decision");
      auto event = make_event([&](auto ev) { ev.setProposal(proposal); });
      auto rp = self->make_response_promise();
      st.waiting = waiting_proposal{seq, event, rp};
      st.broadcast(event);
      return rp;
    },
    [self](messages::notify_atom, const payload& p) {
      auto& st = self->state;
      std::string err;
      auto msg = messages::open_payload<schema::OperatorEvent>(p, err);
      if (!msg)
        return;  // no one to answer: a notice that does not decode is dropped
      auto ev = msg->root<schema::OperatorEvent>();
      // The supervisor decided the waiting proposal itself (its timeout policy): withdraw
      // it. Its request is not answered; the supervisor no longer waits for it.
      if (ev.isDecided() && st.waiting && ev.getDecided().getSeq() == st.waiting->seq)
        st.waiting.reset();
      if (ev.isEnded())
        st.ended = true;
      st.broadcast(p.bytes);
    },
    [self](messages::status_atom) { return static_cast<uint32_t>(self->state.shells.size()); },
    [self](frame_atom, const std::string& id, const std::string& body, uint32_t frames) {
      on_frame(self, id, body, frames);
    },
    [self](expire_atom, const std::string& id) {
      self->state.free_floor(id, "was detached (silent)");
      self->state.shells.erase(id);
    },
  };
}

// ZeroMQ binds an ipc path that another process serves by replacing its socket file (the
// other gateway silently loses its shells): refuse a path someone still listens on.
bool ipc_in_use(const std::string& endpoint) {
  constexpr std::string_view scheme = "ipc://";
  if (endpoint.rfind(scheme, 0) != 0)
    return false;
  auto path = endpoint.substr(scheme.size());
  sockaddr_un addr{};
  if (path.empty() || path == "*" || path.size() >= sizeof(addr.sun_path))
    return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0)
    return false;
  bool listening = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return listening;
}

}  // namespace

caf::expected<operator_gateway> spawn_operator_gateway(caf::actor_system& sys,
                                                       const operator_gateway_config& config) {
  if (config.liveness.count() <= 0)
    return make_error(error_code::bad_input, "the operator gateway's liveness period must be > 0");
  if (ipc_in_use(config.endpoint))
    return make_error(error_code::bad_input, "cannot bind the operator gateway to '"
                                               + config.endpoint
                                               + "': another process listens on it");
  auto io = std::make_shared<gateway_io>();
  io->liveness = config.liveness;
  std::string bound;
  try {
    io->router = zmq::socket_t(io->context, zmq::socket_type::router);
    if (!config.token_file.empty()) {
      std::string error;
      auto creds = read_cluster_credentials(config.token_file, error);
      if (!creds)
        return make_error(error_code::bad_input, "--token-file: " + error);
      io->auth = std::make_unique<curve_server_auth>(io->context, *creds);
      make_curve_server(io->router, *creds);
    }
    io->router.set(zmq::sockopt::linger, 0);
    io->router.set(zmq::sockopt::router_mandatory, 1);
    io->router.set(zmq::sockopt::maxmsgsize, int64_t{64} << 20);  // a kernel source is small
    io->router.bind(config.endpoint);
    bound = io->router.get(zmq::sockopt::last_endpoint);
    io->to_thread = zmq::socket_t(io->context, zmq::socket_type::pair);
    io->to_thread.set(zmq::sockopt::sndhwm, 0);
    io->to_thread.set(zmq::sockopt::linger, 0);
    io->to_thread.bind(inproc_endpoint);
    io->from_actor = zmq::socket_t(io->context, zmq::socket_type::pair);
    io->from_actor.set(zmq::sockopt::rcvhwm, 0);
    io->from_actor.set(zmq::sockopt::linger, 0);
    io->from_actor.connect(inproc_endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(error_code::bad_input, "cannot bind the operator gateway to '"
                                               + config.endpoint + "': " + e.what());
  }
  auto welcome = config.welcome.empty() ? "maxkernel operator gateway at " + bound
                                        : config.welcome;
  auto hdl = sys.spawn(gateway_behavior, io, std::move(welcome));
  return operator_gateway{caf::actor_cast<messages::operator_actor>(hdl), bound};
}

}  // namespace maxkernel::cluster
