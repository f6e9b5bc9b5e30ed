// Guards the TLS handshakes of CAF's OpenSSL module: logs the peers the node port refused,
// notes why our own connects failed, and ends handshakes that take too long.
//
// CAF 0.17's OpenSSL module has no hook for a failed handshake: it drops the connection and
// says nothing (Debian builds CAF without logging). Worse, while a handshake waits for its
// peer, its multiplexer thread busy-loops (measured: one idle TCP connection to a TLS port
// costs a core, on the accepting and on the connecting side, and an actor system with such
// a connection pending cannot shut down), and it sets no deadline on the handshake. So this
// file defines SSL_accept and SSL_connect, the two OpenSSL calls libcaf_openssl makes for
// handshakes: the program's definitions interpose on libssl's (ELF symbol interposition; the
// executable exports them because libcaf_openssl references them) and forward to libssl's
// (dlsym RTLD_NEXT). They note every failure that is not "try again", and fail a handshake
// still unfinished after the deadline (an error on OpenSSL's queue: CAF closes the
// connection), which bounds the busy loop. Only CAF's sessions are guarded (they ask for a
// peer certificate on both sides; libcurl's HTTPS in the same process passes untouched).
// SSL_read and SSL_write are wrapped too, only to
// clear the thread's error queue first as OpenSSL requires (CAF does not: the errors of one
// failed handshake could otherwise fail the next connection served by the same thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace maxkernel::cluster {

using tls_log_function = std::function<void(const std::string&)>;

// Where refused peers of TLS listeners are reported: one line each, with the peer's address
// and the reason; at most 10 lines a second (the next line counts the ones left out).
// Default: a line on stderr. Called on CAF's multiplexer thread: keep it short.
void set_tls_refusal_log(tls_log_function log);

// Handshakes refused by this process's TLS listeners so far.
uint64_t tls_refusals();

// Whether the process's SSL_accept / SSL_connect are this file's (as libcaf_openssl sees
// them): false when the program was linked so that libssl's win (the executable does not
// export ours); then nothing is logged and no deadline holds.
bool tls_handshake_guard_active();

// How long a TLS handshake (accepting or connecting) may take; default 5 s.
void set_tls_handshake_deadline(std::chrono::milliseconds deadline);

// Why a connect failed on our side.
struct tls_connect_failure {
  std::string reason;      // "" when it did not fail on our side
  bool timed_out = false;  // the handshake passed its deadline (a stalled peer, not a refusal)
  // The peer closed the connection without a TLS verdict (no alert, nothing wrong with its
  // certificate): a process dying or starting on that port, or one that speaks no TLS.
  bool closed = false;
};

// Why the last TLS connect of this process to a peer listening on `port` failed on our side
// ("" when it did not fail or failed only on the peer's side), e.g. "the peer's certificate
// is not from this cluster (unable to get local issuer certificate)".
tls_connect_failure last_tls_connect_failure(uint16_t port);
void clear_tls_connect_failure(uint16_t port);

}  // namespace maxkernel::cluster
