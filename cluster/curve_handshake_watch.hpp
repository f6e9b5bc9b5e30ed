// On a client of the cluster's client port (a shell, a submission): did the supervisor accept
// our CURVE handshake? ZeroMQ hides handshakes from the sockets' users: a refused client just
// never gets a reply. A socket monitor sees them, so a shell with another cluster's token can
// exit 3 saying that authentication failed instead of waiting for a timeout.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace maxkernel::cluster {

class curve_handshake_watch {
public:
  enum class outcome {
    accepted,   // a handshake succeeded
    refused,    // the server refused us, or we it (another cluster's keys, no CURVE)
    timed_out,  // no verdict in time (nobody listening, or the server is stalled)
  };
  struct result {
    outcome what = outcome::timed_out;
    std::string message;  // for refused: starts with "authentication failed"
  };

  // Watches `client` (set up by make_curve_client; start watching before connect). `client`
  // must outlive the watch.
  curve_handshake_watch(zmq::context_t& context, zmq::socket_t& client);
  ~curve_handshake_watch();
  curve_handshake_watch(const curve_handshake_watch&) = delete;
  curve_handshake_watch& operator=(const curve_handshake_watch&) = delete;

  // Waits for the first verdict on the socket's handshakes, at most `timeout`.
  result wait(std::chrono::milliseconds timeout);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace maxkernel::cluster
