#include "cluster/curve_handshake_watch.hpp"

#include <fmt/format.h>
#include <zmq.hpp>

#include <atomic>
#include <cstring>

namespace maxkernel::cluster {

namespace {

constexpr int watched_events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED
                               | ZMQ_EVENT_HANDSHAKE_SUCCEEDED
                               | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
                               | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                               | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

// A server that closes the connection during the handshake this many times in a row is
// refusing us (a server holding another cluster's key cannot read our HELLO and hangs up).
constexpr int hangups_meaning_refusal = 2;

std::string unique_endpoint() {
  static std::atomic<unsigned> counter{0};
  return fmt::format("inproc://maxkernel-curve-watch-{}", counter.fetch_add(1));
}

}  // namespace

struct curve_handshake_watch::impl {
  zmq::socket_t* client;
  zmq::socket_t events;

  impl(zmq::context_t& context, zmq::socket_t& c)
    : client(&c), events(context, zmq::socket_type::pair) {
    std::string endpoint = unique_endpoint();
    if (zmq_socket_monitor(client->handle(), endpoint.c_str(), watched_events) != 0)
      throw zmq::error_t();
    events.set(zmq::sockopt::linger, 0);
    events.connect(endpoint);
  }

  ~impl() { zmq_socket_monitor(client->handle(), nullptr, 0); }
};

curve_handshake_watch::curve_handshake_watch(zmq::context_t& context, zmq::socket_t& client)
  : impl_(std::make_unique<impl>(context, client)) {}

curve_handshake_watch::~curve_handshake_watch() = default;

curve_handshake_watch::result curve_handshake_watch::wait(std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  auto deadline = clock::now() + timeout;
  bool connected = false;
  int hangups = 0;
  std::string address;
  std::string detail;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0)
      break;
    zmq::pollitem_t item{impl_->events.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, left) <= 0)
      continue;
    zmq::message_t head;
    zmq::message_t where;
    if (!impl_->events.recv(head) || !head.more() || !impl_->events.recv(where))
      continue;
    if (head.size() < 6)
      continue;
    uint16_t event = 0;
    uint32_t value = 0;
    std::memcpy(&event, head.data(), 2);
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, 4);
    address = where.to_string();
    switch (event) {
      case ZMQ_EVENT_CONNECTED:
        connected = true;
        break;
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        return {outcome::accepted, ""};
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        return {outcome::refused,
                fmt::format("authentication failed: {} refused this client's key (ZAP status "
                            "{}): the token is not this cluster's",
                            address, value)};
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return {outcome::refused,
                fmt::format("authentication failed: the CURVE handshake with {} failed "
                            "(ZeroMQ protocol error {:#x}): the server does not hold this "
                            "cluster's keys or does not use CURVE",
                            address, value)};
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        // A connection lost mid-handshake (a server going down does that too): counted
        // when it disconnects.
        detail = zmq_strerror(static_cast<int>(value));
        break;
      case ZMQ_EVENT_DISCONNECTED:
        if (connected && ++hangups >= hangups_meaning_refusal)
          return {outcome::refused,
                  fmt::format("authentication failed: {} closed the connection during the "
                              "CURVE handshake {} times{}: it holds another cluster's keys "
                              "(or is not a maxkernel client port)",
                              address, hangups, detail.empty() ? "" : " (" + detail + ")")};
        connected = false;
        break;
      default:
        break;
    }
  }
  return {outcome::timed_out,
          address.empty() ? std::string("no connection")
                          : fmt::format("no handshake verdict from {}", address)};
}

}  // namespace maxkernel::cluster
