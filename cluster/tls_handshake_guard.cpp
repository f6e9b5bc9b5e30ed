#include "cluster/tls_handshake_guard.hpp"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>

namespace maxkernel::cluster {

// The definition after ours in lookup order: libssl's.
static void* real_symbol(const char* name) {
  void* f = dlvsym(RTLD_NEXT, name, "OPENSSL_3.0.0");
  if (!f)
    f = dlsym(RTLD_NEXT, name);
  if (!f) {
    std::cerr << "maxkernel: cannot find OpenSSL's " << name << ": " << dlerror() << "\n";
    std::abort();
  }
  return f;
}

namespace {

using handshake_fn = int (*)(SSL*);

handshake_fn real(const char* name) { return reinterpret_cast<handshake_fn>(real_symbol(name)); }

struct peer {
  std::string address;  // "1.2.3.4:5678", "[::1]:5678" or "unknown"
  uint16_t port = 0;
};

peer peer_of(SSL* ssl) {
  peer p{"unknown", 0};
  int fd = SSL_get_fd(ssl);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return p;
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    p.port = ntohs(in->sin_port);
    p.address = fmt::format("{}:{}", host, p.port);
  } else if (addr.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    p.port = ntohs(in->sin6_port);
    p.address = fmt::format("[{}]:{}", host, p.port);
  }
  return p;
}

// The connection ended without a verdict (no certificate failed, no alert): reset, or
// closed, which OpenSSL 3 reports as an "unexpected eof" error and 1.1 as a syscall error.
bool closed_without_verdict(SSL* ssl, int error_kind) {
  if (SSL_get_verify_result(ssl) != X509_V_OK)
    return false;
  unsigned long e = ERR_peek_last_error();
  if (error_kind == SSL_ERROR_SYSCALL)
    return e == 0;
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
  return error_kind == SSL_ERROR_SSL && ERR_GET_LIB(e) == ERR_LIB_SSL
         && ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING;
#else
  return false;
#endif
}

// Why the handshake failed, without taking the errors off the queue (CAF reads them next).
std::string reason_of(SSL* ssl, int error_kind, bool we_verify_peer_as) {
  if (closed_without_verdict(ssl, error_kind))
    return "the connection closed during the TLS handshake";
  long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK)
    return fmt::format("{} certificate is not from this cluster ({})",
                       we_verify_peer_as ? "the peer's" : "its",
                       X509_verify_cert_error_string(verify));
  unsigned long e = ERR_peek_last_error();
  if (e != 0) {
    const char* r = ERR_reason_error_string(e);
    std::string reason = r ? r : "unknown reason";
    // The peer's alert about our certificate: it trusts another CA.
    if (reason.find("unknown ca") != std::string::npos
        || reason.find("bad certificate") != std::string::npos
        || reason.find("certificate unknown") != std::string::npos)
      return fmt::format("it does not trust this cluster's certificate: another cluster's "
                         "credentials? ({})",
                         reason);
    return fmt::format("TLS handshake failed ({})", reason);
  }
  return "TLS handshake failed";
}

struct state {
  std::mutex mutex;
  tls_log_function log;
  std::map<uint16_t, tls_connect_failure> connect_failures;
  std::atomic<uint64_t> refusals{0};
  // Rate limit: lines in the current second, and the ones left out.
  std::chrono::steady_clock::time_point window_start;
  int lines_in_window = 0;
  uint64_t left_out = 0;
};

state& shared() {
  static state s;
  return s;
}

void note_refusal(const peer& p, const std::string& reason) {
  auto& s = shared();
  s.refusals.fetch_add(1);
  std::string line;
  tls_log_function log;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto now = std::chrono::steady_clock::now();
    if (now - s.window_start >= std::chrono::seconds(1)) {
      s.window_start = now;
      s.lines_in_window = 0;
    }
    if (++s.lines_in_window > 10) {
      ++s.left_out;
      return;
    }
    line = fmt::format("node port: refused a peer from {}: {}", p.address, reason);
    if (s.left_out > 0) {
      line += fmt::format(" ({} more refused before, not logged)", s.left_out);
      s.left_out = 0;
    }
    log = s.log;
  }
  if (log)
    log(line);
  else
    std::cerr << line << '\n';
}

// What we keep per connection, on the SSL object itself: the peer, read at the first
// handshake call while the socket is surely connected (a refusing peer may have hung up by
// the time the failure shows), and whether the failure was reported (CAF calls SSL_accept
// again on a connection whose handshake failed: its read and its write path each try).
struct connection_note {
  peer who;
  bool reported = false;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

void free_note(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<connection_note*>(ptr);
}

int note_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, free_note);
  return index;
}

connection_note* note_of(SSL* ssl) {
  auto* note = static_cast<connection_note*>(SSL_get_ex_data(ssl, note_index()));
  if (!note) {
    note = new connection_note{peer_of(ssl), false, std::chrono::steady_clock::now()};
    if (!SSL_set_ex_data(ssl, note_index(), note)) {
      delete note;
      return nullptr;
    }
  }
  return note;
}

std::atomic<int64_t> deadline_ms{5000};

// CAF's mutual-TLS sessions: it asks for SSL_VERIFY_FAIL_IF_NO_PEER_CERT on both sides, which
// no ordinary client does. Other OpenSSL users of the process (libcurl's HTTPS to an LLM
// endpoint) pass through untouched: no deadline, no notes.
bool cluster_session(SSL* ssl) {
  return (SSL_get_verify_mode(ssl) & SSL_VERIFY_FAIL_IF_NO_PEER_CERT) != 0;
}

// A handshake still waiting after the deadline fails: an error on the queue makes
// SSL_get_error (which CAF asks next) answer SSL_ERROR_SSL instead of "want read".
bool past_deadline(int& ret, int& kind, connection_note* note) {
  if (!note || std::chrono::steady_clock::now() - note->started
                 < std::chrono::milliseconds(deadline_ms.load()))
    return false;
  ERR_raise_data(ERR_LIB_USER, 1, "the TLS handshake did not complete within %lld ms",
                 static_cast<long long>(deadline_ms.load()));
  ret = -1;
  kind = SSL_ERROR_SSL;
  return true;
}

// A failure not reported yet for this connection; `timed_out` when the deadline made it.
bool failed(SSL* ssl, int& ret, int& kind, connection_note* note, bool& timed_out) {
  timed_out = false;
  if (ret == 1)
    return false;
  kind = SSL_get_error(ssl, ret);
  if (kind == SSL_ERROR_WANT_READ || kind == SSL_ERROR_WANT_WRITE) {
    if (!past_deadline(ret, kind, note))
      return false;
    timed_out = true;
  }
  if (note && note->reported)
    return false;
  if (note)
    note->reported = true;
  return true;
}

}  // namespace

void set_tls_refusal_log(tls_log_function log) {
  std::lock_guard<std::mutex> lock(shared().mutex);
  shared().log = std::move(log);
}

uint64_t tls_refusals() { return shared().refusals.load(); }

tls_connect_failure last_tls_connect_failure(uint16_t port) {
  auto& s = shared();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.connect_failures.find(port);
  return it == s.connect_failures.end() ? tls_connect_failure{} : it->second;
}

bool tls_handshake_guard_active() {
  // What a shared library's reference resolves to: the first definition in global lookup.
  void* accept = dlsym(RTLD_DEFAULT, "SSL_accept");
  void* connect = dlsym(RTLD_DEFAULT, "SSL_connect");
  return accept == reinterpret_cast<void*>(&::SSL_accept)
         && connect == reinterpret_cast<void*>(&::SSL_connect);
}

void set_tls_handshake_deadline(std::chrono::milliseconds deadline) {
  deadline_ms.store(deadline.count());
}

void clear_tls_connect_failure(uint16_t port) {
  auto& s = shared();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.connect_failures.erase(port);
}

}  // namespace maxkernel::cluster

// The interposers (see the header). C linkage and default visibility: they replace libssl's
// for every caller in the process, libcaf_openssl included.
extern "C" {

__attribute__((visibility("default"))) int SSL_accept(SSL* ssl) {
  using namespace maxkernel::cluster;
  static const handshake_fn accept = real("SSL_accept");
  ERR_clear_error();
  if (!cluster_session(ssl))
    return accept(ssl);
  connection_note* note = note_of(ssl);
  int ret = accept(ssl);
  int kind = 0;
  bool timed_out = false;
  if (failed(ssl, ret, kind, note, timed_out))
    note_refusal(note ? note->who : peer_of(ssl),
                 timed_out ? fmt::format("its TLS handshake did not complete within {} ms",
                                         deadline_ms.load())
                           : reason_of(ssl, kind, false));
  return ret;
}

__attribute__((visibility("default"))) int SSL_connect(SSL* ssl) {
  using namespace maxkernel::cluster;
  static const handshake_fn connect = real("SSL_connect");
  ERR_clear_error();
  if (!cluster_session(ssl))
    return connect(ssl);
  connection_note* note = note_of(ssl);
  int ret = connect(ssl);
  int kind = 0;
  bool timed_out = false;
  if (failed(ssl, ret, kind, note, timed_out)) {
    peer p = note ? note->who : peer_of(ssl);
    tls_connect_failure f{
      timed_out ? fmt::format("the TLS handshake did not complete within {} ms",
                              deadline_ms.load())
                : reason_of(ssl, kind, true),
      timed_out, !timed_out && closed_without_verdict(ssl, kind)};
    auto& s = shared();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.connect_failures[p.port] = std::move(f);
  }
  return ret;
}

// OpenSSL's rule (SSL_get_error(3)): the thread's error queue must be empty before an I/O
// call, or SSL_get_error misreads it. CAF never clears it, so the errors of one failed
// handshake (its own, or our deadline's) could fail the next "want read" of any connection
// served by the same multiplexer thread.
__attribute__((visibility("default"))) int SSL_read(SSL* ssl, void* buf, int num) {
  using read_fn = int (*)(SSL*, void*, int);
  static const auto read = reinterpret_cast<read_fn>(maxkernel::cluster::real_symbol("SSL_read"));
  ERR_clear_error();
  return read(ssl, buf, num);
}

__attribute__((visibility("default"))) int SSL_write(SSL* ssl, const void* buf, int num) {
  using write_fn = int (*)(SSL*, const void*, int);
  static const auto write =
    reinterpret_cast<write_fn>(maxkernel::cluster::real_symbol("SSL_write"));
  ERR_clear_error();
  return write(ssl, buf, num);
}

}  // extern "C"
