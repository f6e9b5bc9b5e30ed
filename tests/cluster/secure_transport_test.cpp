// The transports with a cluster's credentials, for real on loopback:
// - two actor systems with the same cluster's credentials exchange a typed request over
//   mutual TLS; another cluster's credentials, a plain middleman, raw bytes and TLS clients
//   without the cluster's certificate get nothing, and the publisher keeps serving;
// - a CURVE client with the cluster's keys gets a reply on the client port; other keys, a
//   client key the ZAP handler does not know, or no CURVE at all get nothing.
#include "cluster/cluster_credentials.hpp"
#include "cluster/curve_handshake_watch.hpp"
#include "cluster/secure_transport.hpp"
#include "cluster/tls_handshake_guard.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <zmq.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

namespace maxkernel::cluster::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using adder_actor = caf::typed_actor<caf::replies_to<int32_t, int32_t>::with<int32_t>>;

adder_actor::behavior_type adder() {
  return {[](int32_t a, int32_t b) { return a + b; }};
}

struct node_config : caf::actor_system_config {
  explicit node_config(const cluster_credentials* creds) {
    load<caf::io::middleman>();
    if (creds)
      enable_cluster_tls(*this, *creds);
  }
};

// Two clusters' credentials, made once for the suite.
class SecureTransport : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    set_tls_refusal_log([](const std::string& line) {
      std::lock_guard<std::mutex> lock(log_mutex_);
      log_.push_back(line);
    });
    std::random_device rd;
    root_ = fs::temp_directory_path() / ("mk_transport_" + std::to_string(rd()));
    a_ = make_cluster("a");
    b_ = make_cluster("b");
  }
  static void TearDownTestSuite() {
    set_tls_refusal_log({});
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  static cluster_credentials make_cluster(const char* name) {
    auto r = init_cluster_credentials((root_ / name).string());
    EXPECT_EQ(r.status, init_status::written) << r.error;
    std::string error;
    auto c = read_cluster_credentials((root_ / name / "token").string(), error);
    EXPECT_TRUE(c.has_value()) << error;
    return c.value_or(cluster_credentials{});
  }

  // An adder published with TLS on a free loopback port.
  struct server {
    node_config cfg{&a_};
    caf::actor_system sys{cfg};
    adder_actor adder_handle = sys.spawn(adder);
    uint16_t port = 0;
    server() {
      auto p = publish_actor(sys, caf::actor_cast<caf::actor>(adder_handle), "127.0.0.1", 0,
                             sys.message_types(adder_handle));
      EXPECT_TRUE(p) << sys.render(p.error());
      port = p ? *p : 0;
    }
    // A published actor keeps the system's destructor waiting until it exits.
    ~server() { caf::anon_send_exit(adder_handle, caf::exit_reason::user_shutdown); }
  };

  // Connects with `creds` (plain middleman without) and asks 2 + 3.
  static caf::expected<int32_t> ask(uint16_t port, const cluster_credentials* creds) {
    node_config cfg{creds};
    caf::actor_system sys{cfg};
    auto remote = connect_actor(sys, "127.0.0.1", port, 5s, sys.message_types<adder_actor>());
    if (!remote)
      return std::move(remote.error());
    caf::scoped_actor self{sys};
    caf::expected<int32_t> result{caf::sec::runtime_error};
    self->request(caf::actor_cast<adder_actor>(*remote), 5s, int32_t{2}, int32_t{3})
      .receive([&](int32_t sum) { result = sum; }, [&](caf::error& e) { result = std::move(e); });
    return result;
  }

  // The refused peers logged since the last call.
  static std::vector<std::string> take_log() {
    std::this_thread::sleep_for(50ms);  // CAF's multiplexer thread logs asynchronously
    std::lock_guard<std::mutex> lock(log_mutex_);
    return std::exchange(log_, {});
  }
  static bool logged(const std::vector<std::string>& lines, const std::string& what) {
    for (const auto& l : lines)
      if (l.find("refused a peer from 127.0.0.1:") != std::string::npos
          && l.find(what) != std::string::npos)
        return true;
    return false;
  }

  static inline std::mutex log_mutex_;
  static inline std::vector<std::string> log_;
  static inline fs::path root_;
  static inline cluster_credentials a_;
  static inline cluster_credentials b_;
};

TEST_F(SecureTransport, SameClusterExchangesATypedRequestOverTls) {
  EXPECT_TRUE(tls_handshake_guard_active());
  server s;
  ASSERT_NE(s.port, 0);
  EXPECT_TRUE(cluster_tls_enabled(s.sys));
  take_log();
  uint64_t refusals = tls_refusals();
  auto sum = ask(s.port, &a_);
  ASSERT_TRUE(sum) << s.sys.render(sum.error());
  EXPECT_EQ(*sum, 5);
  EXPECT_EQ(tls_refusals(), refusals);
  EXPECT_TRUE(take_log().empty());
}

// Messages larger than a TLS record (16 KB) and than the socket buffers, several in flight:
// CAF's OpenSSL streams must carry them whole.
TEST_F(SecureTransport, LargeMessagesCrossTlsIntact) {
  node_config server_cfg{&a_};
  caf::actor_system server{server_cfg};
  auto echo = server.spawn([]() -> caf::behavior {
    return {[](const std::string& x) { return x; }};
  });
  auto port = publish_actor(server, echo, "127.0.0.1", 0);
  ASSERT_TRUE(port) << server.render(port.error());
  {
    node_config client_cfg{&a_};
    caf::actor_system client{client_cfg};
    auto remote = connect_actor(client, "127.0.0.1", *port, 5s);
    ASSERT_TRUE(remote) << client.render(remote.error());
    caf::scoped_actor self{client};
    for (auto [size, count] : {std::pair<size_t, int>{8'000'000, 2}, {1'000'000, 20}}) {
      std::string msg(size, '\0');
      for (size_t i = 0; i < size; ++i)
        msg[i] = static_cast<char>('a' + (i * 7 + size) % 26);
      for (int i = 0; i < count; ++i)
        self->send(*remote, msg);
      int intact = 0;
      for (int i = 0; i < count; ++i)
        self->receive([&](const std::string& back) { intact += back == msg; },
                      caf::after(std::chrono::seconds(30)) >> [] {});
      EXPECT_EQ(intact, count) << size << " bytes";
    }
  }
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_F(SecureTransport, AnotherClustersCredentialsAreRefused) {
  server s;
  auto t0 = std::chrono::steady_clock::now();
  auto refused = ask(s.port, &b_);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(authentication_failed(refused.error())) << s.sys.render(refused.error());
  EXPECT_NE(s.sys.render(refused.error()).find("authentication failed"), std::string::npos)
    << s.sys.render(refused.error());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);  // refused, not timed out
  // Our side saw the peer's certificate fail; the server logged the refused peer.
  EXPECT_NE(s.sys.render(refused.error()).find("certificate is not from this cluster"),
            std::string::npos)
    << s.sys.render(refused.error());
  auto lines = take_log();
  EXPECT_TRUE(logged(lines, "another cluster's credentials")) << ::testing::PrintToString(lines);
  auto sum = ask(s.port, &a_);  // the publisher still serves its cluster
  ASSERT_TRUE(sum) << s.sys.render(sum.error());
  EXPECT_EQ(*sum, 5);
}

TEST_F(SecureTransport, APlainMiddlemanGetsNothing) {
  server s;
  take_log();
  auto refused = ask(s.port, nullptr);
  EXPECT_FALSE(refused);
  auto lines = take_log();
  EXPECT_TRUE(logged(lines, "")) << ::testing::PrintToString(lines);
  auto sum = ask(s.port, &a_);
  ASSERT_TRUE(sum) << s.sys.render(sum.error());
  EXPECT_EQ(*sum, 5);
}

int tcp_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Everything the server sends until it closes the connection (or 2 s pass).
std::string drain(int fd) {
  std::string got;
  char buf[4096];
  auto until = std::chrono::steady_clock::now() + 2s;
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0)
      continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST_F(SecureTransport, RawBytesGetNothingAndThePublisherSurvives) {
  server s;
  std::mt19937 rng(7);
  std::string garbage(4096, '\0');
  for (auto& ch : garbage)
    ch = static_cast<char>(rng());
  // Random bytes; then bytes that look like a CAF peer's first message (a BASP header:
  // operation 0 = server handshake, 0 flags, a payload length) without TLS.
  std::string basp_like("\x00\x00\x00\x00\x00\x00\x00\x40", 8);
  basp_like += std::string(64, 'A');
  for (const std::string& bytes : {garbage, basp_like}) {
    take_log();
    int fd = tcp_connect(s.port);
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    std::string answer = drain(fd);
    ::close(fd);
    // At most a TLS alert record (content type 21), never application data.
    if (!answer.empty()) {
      EXPECT_EQ(static_cast<unsigned char>(answer[0]), 21) << "got " << answer.size() << " bytes";
      EXPECT_LE(answer.size(), 7u);
    }
    auto lines = take_log();
    EXPECT_TRUE(logged(lines, "")) << ::testing::PrintToString(lines);
  }
  auto sum = ask(s.port, &a_);
  ASSERT_TRUE(sum) << s.sys.render(sum.error());
  EXPECT_EQ(*sum, 5);
}

// A TLS client that completes its side of the handshake (it trusts anything) but presents
// no certificate, or another cluster's: the server never sends it application data.
TEST_F(SecureTransport, TlsClientsWithoutTheClustersCertificateGetNothing) {
  server s;
  for (const cluster_credentials* creds : {static_cast<const cluster_credentials*>(nullptr),
                                           static_cast<const cluster_credentials*>(&b_)}) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    ASSERT_NE(ctx, nullptr);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
    if (creds) {
      SSL_CTX_set_default_passwd_cb_userdata(ctx, const_cast<char*>(creds->key_passphrase.c_str()));
      ASSERT_EQ(SSL_CTX_use_certificate_chain_file(ctx, creds->certificate_file.c_str()), 1);
      ASSERT_EQ(SSL_CTX_use_PrivateKey_file(ctx, creds->key_file.c_str(), SSL_FILETYPE_PEM), 1);
    }
    int fd = tcp_connect(s.port);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    int connected = SSL_connect(ssl);
    char buf[256];
    int n = connected == 1 ? SSL_read(ssl, buf, sizeof buf) : 0;
    EXPECT_LE(n, 0) << (creds ? "another cluster's certificate" : "no certificate")
                    << " received " << n << " bytes of application data";
    auto lines = take_log();
    EXPECT_TRUE(logged(lines, creds ? "its certificate is not from this cluster"
                                    : "did not return a certificate"))
      << ::testing::PrintToString(lines);
    SSL_free(ssl);
    ::close(fd);
    SSL_CTX_free(ctx);
    ERR_clear_error();
  }
  auto sum = ask(s.port, &a_);
  ASSERT_TRUE(sum) << s.sys.render(sum.error());
  EXPECT_EQ(*sum, 5);
}

// A socket listening on a free loopback port (the kernel completes TCP handshakes on it
// whether anyone accepts or not); -1 on failure.
int loopback_listener(uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0
      || ::listen(fd, 8) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return -1;
  port = ntohs(addr.sin_port);
  return fd;
}

// A loopback port nobody listens on (taken and closed again).
uint16_t free_port() {
  uint16_t port = 0;
  int fd = loopback_listener(port);
  EXPECT_GE(fd, 0);
  ::close(fd);
  return port;
}

TEST_F(SecureTransport, ConnectToNothingIsNotAnAuthenticationFailure) {
  node_config cfg{&a_};
  caf::actor_system sys{cfg};
  auto r = connect_actor(sys, "127.0.0.1", free_port(), 3s);
  ASSERT_FALSE(r);
  EXPECT_FALSE(authentication_failed(r.error())) << sys.render(r.error());
}

// A peer that accepts and closes before any TLS byte, as a supervisor killed a moment ago
// does (its listening socket still takes the connection) or one starting again: no verdict
// on the credentials, so a node tries again instead of exiting as refused.
TEST_F(SecureTransport, APeerClosingMidHandshakeIsNotAnAuthenticationFailure) {
  for (bool reset : {false, true}) {
    uint16_t port = 0;
    int fd = loopback_listener(port);
    ASSERT_GE(fd, 0);
    std::thread closer([fd, reset] {
      int c = ::accept(fd, nullptr, nullptr);
      if (c < 0)
        return;
      char hello[4096];
      (void)::recv(c, hello, sizeof hello, 0);  // the ClientHello, then gone
      if (reset) {  // as the kernel ends a killed process's connections
        linger now{1, 0};
        ::setsockopt(c, SOL_SOCKET, SO_LINGER, &now, sizeof now);
      }
      ::close(c);
    });
    {
      node_config cfg{&a_};
      caf::actor_system sys{cfg};
      auto r = connect_actor(sys, "127.0.0.1", port, 3s);
      EXPECT_FALSE(r);  // (no ASSERT while the closer thread runs)
      if (!r) {
        EXPECT_FALSE(authentication_failed(r.error())) << reset << " " << sys.render(r.error());
        EXPECT_NE(sys.render(r.error()).find("closed the connection during the TLS handshake"),
                  std::string::npos)
          << reset << " " << sys.render(r.error());
      }
    }
    closer.join();
    ::close(fd);
  }
}

// A peer that accepts (the kernel completes the TCP handshake on a listening socket) and
// never answers: connect_actor gives up at its timeout instead of waiting forever.
TEST_F(SecureTransport, AStalledPeerTimesOut) {
  // CAF busy-loops while a handshake waits and cannot shut down until it ends: the
  // handshake deadline ends it.
  set_tls_handshake_deadline(1s);
  uint16_t port = 0;
  int fd = loopback_listener(port);
  ASSERT_GE(fd, 0);
  {
    node_config cfg{&a_};
    caf::actor_system sys{cfg};
    auto t0 = std::chrono::steady_clock::now();
    auto r = connect_actor(sys, "127.0.0.1", port, 500ms);
    auto waited = std::chrono::steady_clock::now() - t0;
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), caf::sec::request_timeout) << sys.render(r.error());
    EXPECT_FALSE(authentication_failed(r.error()));
    EXPECT_GE(waited, 450ms);
    EXPECT_LT(waited, 3s);
  }  // the system shuts down once the handshake passes its deadline
  ::close(fd);
  set_tls_handshake_deadline(5s);
}

// A peer that connects to the node port and sends nothing is closed at the deadline, and
// the publisher keeps serving.
TEST_F(SecureTransport, AnIdleConnectionIsClosedAtTheHandshakeDeadline) {
  set_tls_handshake_deadline(500ms);
  server s;
  take_log();
  int fd = tcp_connect(s.port);
  auto t0 = std::chrono::steady_clock::now();
  std::string answer = drain(fd);  // until the server closes, at most 2 s
  auto waited = std::chrono::steady_clock::now() - t0;
  ::close(fd);
  EXPECT_TRUE(answer.empty() || static_cast<unsigned char>(answer[0]) == 21);
  EXPECT_GE(waited, 400ms);
  EXPECT_LT(waited, 1900ms);
  auto lines = take_log();
  EXPECT_TRUE(logged(lines, "did not complete within 500 ms")) << ::testing::PrintToString(lines);
  set_tls_handshake_deadline(5s);
  auto sum = ask(s.port, &a_);
  ASSERT_TRUE(sum) << s.sys.render(sum.error());
  EXPECT_EQ(*sum, 5);
}

// ---- ZeroMQ CURVE -------------------------------------------------------------------------

class CurveTransport : public SecureTransport {
protected:
  // Sends one request from `client` and serves it on `server` if it arrives within the
  // short poll; returns the reply the client got ("" for none).
  static std::string round_trip(zmq::socket_t& server, zmq::socket_t& client) {
    client.send(zmq::str_buffer("ping"), zmq::send_flags::none);
    zmq::pollitem_t in{server.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&in, 1, std::chrono::milliseconds(500)) <= 0)
      return "";
    zmq::message_t m;
    EXPECT_TRUE(server.recv(m));
    server.send(zmq::str_buffer("pong"), zmq::send_flags::none);
    zmq::pollitem_t back{client.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&back, 1, std::chrono::milliseconds(2000)) <= 0)
      return "";
    zmq::message_t reply;
    EXPECT_TRUE(client.recv(reply));
    return reply.to_string();
  }
};

TEST_F(CurveTransport, OnlyTheClustersClientsGetAReply) {
  zmq::context_t ctx;
  std::mutex mutex;
  std::vector<std::string> log;
  zmq::socket_t server(ctx, zmq::socket_type::rep);
  server.set(zmq::sockopt::linger, 0);
  curve_server_auth auth(
    ctx, a_,
    [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      log.push_back(line);
    },
    &server);
  // `from` "127.0.0.1" for the ZAP handler's lines; the ones the socket monitor finds may
  // also read "unknown" (the peer's address is read when the event arrives, best effort).
  auto logged = [&](const std::string& what, bool address_known) {
    std::this_thread::sleep_for(100ms);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& l : log)
      if (l.find(what) != std::string::npos
          && (l.find("refused a peer from 127.0.0.1") != std::string::npos
              || (!address_known && l.find("refused a peer from unknown") != std::string::npos)))
        return true;
    return false;
  };
  make_curve_server(server, a_);
  server.bind("tcp://127.0.0.1:*");
  std::string endpoint = server.get(zmq::sockopt::last_endpoint);

  auto client_with = [&](auto configure) {
    auto c = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::req);
    c->set(zmq::sockopt::linger, 0);
    configure(*c);
    c->connect(endpoint);
    return c;
  };
  // The cluster's client.
  auto good = client_with([&](zmq::socket_t& s) { make_curve_client(s, a_); });
  EXPECT_EQ(round_trip(server, *good), "pong");
  EXPECT_GE(auth.admitted(), 1u);

  // Another cluster's keys: the CURVE handshake itself fails.
  auto other = client_with([&](zmq::socket_t& s) { make_curve_client(s, b_); });
  EXPECT_EQ(round_trip(server, *other), "");
  EXPECT_TRUE(logged("does not decrypt with this cluster's server key", false))
    << ::testing::PrintToString(log);
  // The server's public key (it is public) but a client key of its own: the ZAP handler
  // refuses it and logs where it came from.
  auto stranger = client_with([&](zmq::socket_t& s) {
    char pub[41], sec[41];
    ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
    s.set(zmq::sockopt::curve_serverkey, a_.curve_server_public);
    s.set(zmq::sockopt::curve_publickey, std::string(pub));
    s.set(zmq::sockopt::curve_secretkey, std::string(sec));
  });
  EXPECT_EQ(round_trip(server, *stranger), "");
  EXPECT_GE(auth.refused(), 1u);
  EXPECT_TRUE(logged("its CURVE key is not this cluster's client key", true))
    << ::testing::PrintToString(log);
  // No CURVE at all.
  auto plain = client_with([](zmq::socket_t&) {});
  EXPECT_EQ(round_trip(server, *plain), "");
  EXPECT_TRUE(logged("it does not use CURVE", false)) << ::testing::PrintToString(log);
  {
    // Refused clients keep reconnecting (every 100 ms, for seconds by now); a host (or
    // "unknown") is logged once a minute per reason.
    std::lock_guard<std::mutex> lock(mutex);
    for (const char* why : {"does not decrypt", "is not this cluster's client key",
                            "does not use CURVE"})
      EXPECT_LE(std::count_if(log.begin(), log.end(),
                              [&](const std::string& l) {
                                return l.find(why) != std::string::npos;
                              }),
                2)
        << why << ": " << ::testing::PrintToString(log);
  }

  // The clients' side: a watch on the handshake tells accepted from refused.
  auto verdict = [&](auto configure, const std::string& to) {
    zmq::socket_t c(ctx, zmq::socket_type::req);
    c.set(zmq::sockopt::linger, 0);
    configure(c);
    curve_handshake_watch watch(ctx, c);
    c.connect(to);
    return watch.wait(std::chrono::milliseconds(3000));
  };
  using O = curve_handshake_watch::outcome;
  auto ok = verdict([&](zmq::socket_t& s) { make_curve_client(s, a_); }, endpoint);
  EXPECT_EQ(ok.what, O::accepted) << ok.message;
  auto stranger_verdict = verdict(
    [&](zmq::socket_t& s) {
      char pub[41], sec[41];
      ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
      s.set(zmq::sockopt::curve_serverkey, a_.curve_server_public);
      s.set(zmq::sockopt::curve_publickey, std::string(pub));
      s.set(zmq::sockopt::curve_secretkey, std::string(sec));
    },
    endpoint);
  EXPECT_EQ(stranger_verdict.what, O::refused) << stranger_verdict.message;
  EXPECT_EQ(stranger_verdict.message.rfind("authentication failed", 0), 0u)
    << stranger_verdict.message;
  auto other_verdict = verdict([&](zmq::socket_t& s) { make_curve_client(s, b_); }, endpoint);
  EXPECT_EQ(other_verdict.what, O::refused) << other_verdict.message;
  EXPECT_EQ(other_verdict.message.rfind("authentication failed", 0), 0u) << other_verdict.message;
  // Nobody listening: no verdict, not a refusal.
  std::string nobody = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto none = [&] {
    zmq::socket_t c(ctx, zmq::socket_type::req);
    c.set(zmq::sockopt::linger, 0);
    make_curve_client(c, a_);
    curve_handshake_watch watch(ctx, c);
    c.connect(nobody);
    return watch.wait(std::chrono::milliseconds(500));
  }();
  EXPECT_EQ(none.what, O::timed_out) << none.message;

  // The cluster's clients are still served.
  auto good2 = client_with([&](zmq::socket_t& s) { make_curve_client(s, a_); });
  EXPECT_EQ(round_trip(server, *good2), "pong");
}

}  // namespace
}  // namespace maxkernel::cluster::test
