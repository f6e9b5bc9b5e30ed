// Which peers the node port refused, and why our own TLS connects failed.
//
// CAF 0.17's OpenSSL module has no hook for a failed handshake: it drops the connection and
// says nothing (Debian builds CAF without logging). So this file defines SSL_accept and
// SSL_connect, the two OpenSSL calls libcaf_openssl makes for handshakes: the program's
// definitions interpose on libssl's (ELF symbol interposition; the executable exports them
// because libcaf_openssl references them), forward to libssl's (dlsym RTLD_NEXT) and note
// every failure that is not "try again". Nothing else changes: the result is CAF's to act on.
#pragma once

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

// Why the last TLS connect of this process to a peer listening on `port` failed on our side
// ("" when it did not fail or failed only on the peer's side), e.g. "the peer's certificate
// is not from this cluster (unable to get local issuer certificate)".
std::string last_tls_connect_failure(uint16_t port);
void clear_tls_connect_failure(uint16_t port);

}  // namespace maxkernel::cluster
