#include "cluster/secure_transport.hpp"

#include "cluster/tls_handshake_guard.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/scoped_actor.hpp>

#include <fmt/format.h>
#include <zmq.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

namespace maxkernel::cluster {

namespace {

constexpr const char* auth_failed_prefix = "authentication failed";

caf::io::middleman_actor middleman_of(caf::actor_system& sys) {
  return cluster_tls_enabled(sys) ? sys.openssl_manager().actor_handle()
                                  : sys.middleman().actor_handle();
}

// A connect that ended before CAF's handshake completed: under TLS, the handshake with our
// certificate or theirs failed (or the port speaks no TLS), which is what a peer of another
// cluster sees.
bool handshake_refused(const caf::error& err) {
  return err.category() == caf::atom("system") && err == caf::sec::disconnect_during_handshake;
}

}  // namespace

void enable_cluster_tls(caf::actor_system_config& cfg, const cluster_credentials& creds) {
  if (!tls_handshake_guard_active())
    std::cerr << "warning: the TLS handshake guard is not linked in (see "
                 "cluster/tls_handshake_guard.hpp): refused peers are not logged and TLS "
                 "handshakes have no deadline\n";
  cfg.openssl_certificate = creds.certificate_file;
  cfg.openssl_key = creds.key_file;
  cfg.openssl_passphrase = creds.key_passphrase;
  cfg.openssl_cafile = creds.ca_file;
  cfg.openssl_capath.clear();
  cfg.load<caf::openssl::manager>();
}

bool cluster_tls_enabled(caf::actor_system& sys) {
  return sys.has_openssl_manager() && sys.openssl_manager().authentication_enabled();
}

caf::expected<uint16_t> publish_actor(caf::actor_system& sys, const caf::actor& whom,
                                      const std::string& host, uint16_t port,
                                      const std::set<std::string>& interface) {
  if (!whom)
    return caf::make_error(caf::sec::cannot_publish_invalid_actor);
  caf::scoped_actor self{sys, true};
  caf::expected<uint16_t> result{caf::sec::runtime_error};
  // reuse_addr: a supervisor restarted with --resume binds again while its old
  // connections sit in TIME_WAIT.
  self
    ->request(middleman_of(sys), caf::infinite, caf::publish_atom::value, port,
              caf::actor_cast<caf::strong_actor_ptr>(whom), interface, host, true)
    .receive([&](uint16_t bound) { result = bound; },
             [&](caf::error& err) { result = std::move(err); });
  return result;
}

caf::expected<caf::actor> connect_actor(caf::actor_system& sys, const std::string& host,
                                        uint16_t port, std::chrono::milliseconds timeout,
                                        const std::set<std::string>& interface) {
  caf::scoped_actor self{sys, true};
  caf::expected<caf::actor> result{caf::sec::runtime_error};
  bool tls = cluster_tls_enabled(sys);
  if (tls)
    clear_tls_connect_failure(port);
  self->request(middleman_of(sys), timeout, caf::connect_atom::value, host, port)
    .receive(
      [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
        if (!ptr)
          result = caf::make_error(caf::sec::no_actor_published_at_port,
                                   fmt::format("no actor is published at {}:{}", host, port));
        else if (!interface.empty() && !sys.assignable(ifs, interface))
          result = caf::make_error(
            caf::sec::unexpected_actor_messaging_interface,
            fmt::format("the actor at {}:{} does not offer the expected interface", host, port));
        else
          result = caf::actor_cast<caf::actor>(std::move(ptr));
      },
      [&](caf::error& err) {
        auto failure = tls ? last_tls_connect_failure(port) : tls_connect_failure{};
        if (tls && handshake_refused(err) && failure.timed_out) {
          result = caf::make_error(caf::sec::request_timeout,
                                   fmt::format("no answer from {}:{}: {}", host, port,
                                               failure.reason));
        } else if (tls && failure.closed) {
          // No verdict on anyone's credentials: a supervisor killed a moment ago still
          // accepts on its dying socket, one restarting closes what came too early. Worth
          // another try, unlike a refusal.
          result = caf::make_error(
            caf::sec::cannot_connect_to_node,
            fmt::format("{}:{} closed the connection during the TLS handshake (a process "
                        "stopping or starting there, or a port that speaks no TLS)",
                        host, port));
        } else if (tls && handshake_refused(err)) {
          std::string why = failure.reason;
          if (why.empty())
            why = "the peer refused our certificate (another cluster's credentials?) or "
                  "speaks no TLS";
          result = caf::make_error(caf::sec::disconnect_during_handshake,
                                   fmt::format("{}: the TLS handshake with {}:{} failed: {}",
                                               auth_failed_prefix, host, port, why));
        } else if (err == caf::sec::request_timeout) {
          result = caf::make_error(
            caf::sec::request_timeout,
            fmt::format("no answer from {}:{} within {} ms", host, port, timeout.count()));
        } else {
          result = std::move(err);
        }
      });
  return result;
}

bool authentication_failed(const caf::error& err) {
  if (!err || err.category() != caf::atom("system") || err.context().empty())
    return false;
  const caf::message& ctx = err.context();
  for (size_t i = 0; i < ctx.size(); ++i)
    if (ctx.match_element<std::string>(i)
        && ctx.get_as<std::string>(i).rfind(auth_failed_prefix, 0) == 0)
      return true;
  return false;
}

// ---- ZeroMQ -------------------------------------------------------------------------------

void make_curve_server(zmq::socket_t& socket, const cluster_credentials& creds) {
  socket.set(zmq::sockopt::curve_server, true);
  socket.set(zmq::sockopt::curve_secretkey, creds.curve_server_secret);
  socket.set(zmq::sockopt::zap_domain, cluster_zap_domain);
}

void make_curve_client(zmq::socket_t& socket, const cluster_credentials& creds) {
  socket.set(zmq::sockopt::curve_serverkey, creds.curve_server_public);
  socket.set(zmq::sockopt::curve_publickey, creds.curve_client_public);
  socket.set(zmq::sockopt::curve_secretkey, creds.curve_client_secret);
}

struct curve_server_auth::impl {
  using clock = std::chrono::steady_clock;

  zmq::socket_t zap;
  zmq::socket_t events;               // the watched server socket's monitor, if any
  zmq::socket_t* watched = nullptr;
  std::string client_key;  // 32 bytes, binary: what ZAP requests carry
  log_function log;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> admitted{0};
  std::atomic<uint64_t> refused{0};
  std::thread thread;
  // Monitor state (handler thread only): the peer of each accepted fd, and a handshake
  // failure waiting for the DISCONNECTED event of its connection (libzmq sends the two in a
  // row from its I/O thread).
  std::map<int, std::string> peers;
  std::optional<uint32_t> pending_failure;
  // A refused client reconnects every 100 ms: each host is logged once a minute per reason.
  struct recent_host {
    clock::time_point logged;
    uint64_t left_out = 0;
  };
  std::map<std::string, recent_host> recent;

  impl(zmq::context_t& context, const cluster_credentials& creds, log_function f,
       zmq::socket_t* server)
    : zap(context, zmq::socket_type::rep), log(std::move(f)) {
    uint8_t key[32];
    if (creds.curve_client_public.size() != 40
        || !zmq_z85_decode(key, creds.curve_client_public.c_str()))
      throw std::invalid_argument("the cluster's CURVE client key is not 40 Z85 characters");
    client_key.assign(reinterpret_cast<const char*>(key), sizeof key);
    if (!log)
      log = [](const std::string& line) { std::cerr << line << '\n'; };
    zap.set(zmq::sockopt::linger, 0);
    zap.bind("inproc://zeromq.zap.01");
    if (server) {
      static std::atomic<unsigned> counter{0};
      std::string endpoint = fmt::format("inproc://maxkernel-curve-server-{}", counter++);
      if (zmq_socket_monitor(server->handle(), endpoint.c_str(),
                             ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED
                               | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                               | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
          != 0)
        throw zmq::error_t();
      watched = server;
      events = zmq::socket_t(context, zmq::socket_type::pair);
      events.set(zmq::sockopt::linger, 0);
      events.connect(endpoint);
    }
  }

  ~impl() {
    if (watched)
      zmq_socket_monitor(watched->handle(), nullptr, 0);
  }

  // One line per host, reason and minute; `host` is the peer's address without its port.
  void refuse(const std::string& host, const std::string& why, const std::string& line) {
    refused.fetch_add(1);
    auto now = clock::now();
    auto [it, fresh] = recent.try_emplace(host + '|' + why, recent_host{now, 0});
    if (!fresh && now - it->second.logged < std::chrono::minutes(1)) {
      ++it->second.left_out;
      return;
    }
    std::string more = it->second.left_out > 0
                         ? fmt::format(" ({} more such refusals of this host in the last minute)",
                                       it->second.left_out)
                         : std::string();
    it->second = recent_host{now, 0};
    log(line + more);
  }

  void serve() {
    while (!stop.load()) {
      zmq::pollitem_t items[2] = {{zap.handle(), 0, ZMQ_POLLIN, 0},
                                  {events.handle(), 0, ZMQ_POLLIN, 0}};
      if (zmq::poll(items, watched ? 2 : 1, std::chrono::milliseconds(50)) <= 0)
        continue;
      if (items[0].revents & ZMQ_POLLIN) {
        std::vector<zmq::message_t> frames;
        while (true) {
          zmq::message_t m;
          if (!zap.recv(m))
            break;
          bool more = m.more();
          frames.push_back(std::move(m));
          if (!more)
            break;
        }
        answer(frames);
      }
      if (watched && (items[1].revents & ZMQ_POLLIN))
        on_event();
    }
  }

  // RFC 27: version, request id, domain, address, identity, mechanism, credentials...
  void answer(const std::vector<zmq::message_t>& f) {
    auto text = [&](size_t i) { return i < f.size() ? f[i].to_string() : std::string(); };
    std::string status = "200";
    std::string reason = "OK";
    if (f.size() < 6 || text(0) != "1.0") {
      status = "500";
      reason = "malformed ZAP request";
    } else if (text(2) == cluster_zap_domain) {
      std::string mechanism = text(5);
      bool ok = mechanism == "CURVE" && f.size() >= 7 && f[6].to_string() == client_key;
      if (!ok) {
        status = "400";
        reason = "not a client of this cluster";
        std::string why = mechanism == "CURVE" ? "its CURVE key is not this cluster's client key"
                                               : "it does not use CURVE";
        refuse(text(3), why,
               fmt::format("client port: refused a peer from {} ({}): {}", text(3), mechanism,
                           why));
      } else {
        admitted.fetch_add(1);
      }
    }
    std::vector<std::string> reply{"1.0", text(1), status, reason, "", ""};
    for (size_t i = 0; i < reply.size(); ++i)
      zap.send(zmq::buffer(reply[i]),
               i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }

  // Handshakes that fail before any ZAP request (another cluster's server key, no CURVE).
  void on_event() {
    zmq::message_t head;
    zmq::message_t where;
    if (!events.recv(head) || !head.more() || !events.recv(where) || head.size() < 6)
      return;
    uint16_t event = 0;
    uint32_t value = 0;
    std::memcpy(&event, head.data(), 2);
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, 4);
    int fd = static_cast<int>(value);
    switch (event) {
      case ZMQ_EVENT_ACCEPTED:
        // Read now: by the time the handshake fails the socket may be gone.
        peers[fd] = peer_address(fd);
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        pending_failure = event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? value : 0;
        break;
      case ZMQ_EVENT_DISCONNECTED: {
        auto it = peers.find(fd);
        std::string address = it == peers.end() ? std::string("unknown") : it->second;
        if (it != peers.end())
          peers.erase(it);
        if (!pending_failure)
          break;
        uint32_t code = *pending_failure;
        pending_failure.reset();
        std::string why =
          code == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
            ? "its CURVE handshake does not decrypt with this cluster's server key (another "
              "cluster's token?)"
          : code == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? "it does not use CURVE"
          : code == 0 ? "the connection broke during the CURVE handshake"
                      : fmt::format("CURVE handshake failed (ZeroMQ protocol error {:#x})", code);
        std::string host = address.substr(0, address.rfind(':'));
        refuse(host, why, fmt::format("client port: refused a peer from {}: {}", address, why));
        break;
      }
      default:
        break;
    }
  }

  static std::string peer_address(int fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return "unknown";
    char host[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      return fmt::format("{}:{}", host, ntohs(in->sin_port));
    }
    if (addr.ss_family == AF_INET6) {
      auto* in = reinterpret_cast<sockaddr_in6*>(&addr);
      ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
      return fmt::format("[{}]:{}", host, ntohs(in->sin6_port));
    }
    return "unknown";
  }
};

curve_server_auth::curve_server_auth(zmq::context_t& context, const cluster_credentials& creds,
                                     log_function log, zmq::socket_t* server)
  : impl_(std::make_unique<impl>(context, creds, std::move(log), server)) {
  impl_->thread = std::thread([p = impl_.get()] { p->serve(); });
}

curve_server_auth::~curve_server_auth() {
  impl_->stop.store(true);
  if (impl_->thread.joinable())
    impl_->thread.join();
}

uint64_t curve_server_auth::admitted() const { return impl_->admitted.load(); }
uint64_t curve_server_auth::refused() const { return impl_->refused.load(); }

}  // namespace maxkernel::cluster
