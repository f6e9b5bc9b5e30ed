// The transports of a cluster with its credentials (docs/cluster.md, "Credentials"):
// - the node port (CAF middleman) behind mutual TLS through CAF's OpenSSL module: both ends
//   present the cluster's certificate and verify the other's against the cluster CA, before
//   a single byte reaches CAF's deserializer;
// - the client port (ZeroMQ) behind CURVE, with a ZAP handler that admits only the cluster's
//   client key.
// CAF and cppzmq stay out of this header (forward declarations only).
#pragma once

#include "cluster/cluster_credentials.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

namespace caf {
class actor_system_config;
class actor_system;
class actor;
class error;
template <class T>
class expected;
}  // namespace caf

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace maxkernel::cluster {

// Sets openssl.certificate / key / passphrase / cafile and loads caf::openssl::manager:
// every connection of publish_actor / connect_actor is then mutual TLS (TLS 1.2+, peer
// certificate required and verified against the cluster CA; another cluster's certificate
// fails the handshake). Call after cfg.load<caf::io::middleman>() (the OpenSSL module needs
// it) and after cfg.parse(...) (which could overwrite the openssl.* settings).
void enable_cluster_tls(caf::actor_system_config& cfg, const cluster_credentials& creds);

// Whether `sys` was configured by enable_cluster_tls.
bool cluster_tls_enabled(caf::actor_system& sys);

// Publishes `whom` on host:port ("" or 0.0.0.0: every interface; port 0: any free port)
// with TLS when enabled, else on the plain middleman. Returns the bound port. A typed
// actor passes its handle through caf::actor_cast<caf::actor> and its interface as
// `interface` (sys.message_types(handle)), so that typed peers can check it.
caf::expected<uint16_t> publish_actor(caf::actor_system& sys, const caf::actor& whom,
                                      const std::string& host, uint16_t port,
                                      const std::set<std::string>& interface = {});

// Connects to the actor published at host:port (TLS when enabled), waiting at most
// `timeout` (CAF's own remote_actor waits forever on a peer that accepts and then stalls).
// With a non-empty `interface` (sys.message_types<T>() of the typed handle T the caller will
// actor_cast to), the published actor must offer it. A TLS handshake the peer or we refuse
// fails with an error that authentication_failed() recognises and whose text says
// "authentication failed".
caf::expected<caf::actor> connect_actor(caf::actor_system& sys, const std::string& host,
                                        uint16_t port,
                                        std::chrono::milliseconds timeout =
                                          std::chrono::seconds(10),
                                        const std::set<std::string>& interface = {});

// Whether an error of connect_actor means the peer refused our credentials or presented
// credentials of another cluster (exit code 3, "authentication failed").
bool authentication_failed(const caf::error& err);

// ---- ZeroMQ -------------------------------------------------------------------------------

// Before bind: the socket serves CURVE with the cluster's server key and asks the ZAP
// handler of its context (see curve_server_auth) about every client.
void make_curve_server(zmq::socket_t& socket, const cluster_credentials& creds);

// Before connect: the socket authenticates with the cluster's client key and trusts only
// the cluster's server key.
void make_curve_client(zmq::socket_t& socket, const cluster_credentials& creds);

// The ZAP handler (RFC 27) of one ZeroMQ context, bound to inproc://zeromq.zap.01 by the
// constructor: construct it before binding any make_curve_server socket of that context.
// It admits CURVE clients presenting the cluster's client public key and refuses every
// other, logging the refused peer's address through `log`. Requests from sockets of other
// ZAP domains are admitted untouched (not ours to judge). With `server` (the client port's
// socket, not bound yet; it must outlive this object) it also watches that socket's
// handshakes, to log the peers refused before any ZAP request: another cluster's clients
// (their handshake does not decrypt) and clients without CURVE. A host refused for one reason
// is logged at most once a minute (a refused client reconnects every 100 ms). One per context; it
// stops its thread when destroyed (destroy it before the context and the server socket).
class curve_server_auth {
public:
  using log_function = std::function<void(const std::string&)>;

  curve_server_auth(zmq::context_t& context, const cluster_credentials& creds,
                    log_function log = {},  // default log: one line on stderr
                    zmq::socket_t* server = nullptr);
  ~curve_server_auth();
  curve_server_auth(const curve_server_auth&) = delete;
  curve_server_auth& operator=(const curve_server_auth&) = delete;

  uint64_t admitted() const;  // ZAP requests admitted
  uint64_t refused() const;   // peers refused (ZAP and, with `server`, failed handshakes)

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// The ZAP domain of the cluster's client port.
inline constexpr const char* cluster_zap_domain = "maxkernel-cluster";

}  // namespace maxkernel::cluster
