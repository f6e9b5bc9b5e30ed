// Benchmark (not a test): what mutual TLS costs on the node port. Two actor systems in one
// process, on loopback, the plain middleman against the OpenSSL one with a fresh cluster's
// credentials: sequential request/reply latency and pipelined throughput of an echo actor.
//   bench_tls [PAYLOAD_BYTES=10000] [ROUNDS=3]
// Rounds alternate plain and TLS so that a change in the machine's load hits both.
#include "cluster/cluster_credentials.hpp"
#include "cluster/secure_transport.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>
#include <vector>

namespace {

using namespace maxkernel::cluster;
using clock_type = std::chrono::steady_clock;

struct bench_config : caf::actor_system_config {
  explicit bench_config(const cluster_credentials* creds) {
    load<caf::io::middleman>();
    // The settings of docs/performance.md's latency figures (cpp-stack notes).
    set("scheduler.policy", caf::atom("sharing"));
    set("middleman.workers", size_t{0});
    if (creds)
      enable_cluster_tls(*this, *creds);
  }
};

struct figures {
  double p50_us = 0;
  double p99_us = 0;
  double per_second = 0;
};

figures run(const cluster_credentials* creds, size_t payload) {
  bench_config server_cfg{creds};
  caf::actor_system server{server_cfg};
  auto echo = server.spawn([]() -> caf::behavior {
    return {[](const std::string& x) { return x; }};
  });
  auto port = publish_actor(server, echo, "127.0.0.1", 0);
  if (!port)
    throw std::runtime_error(server.render(port.error()));
  figures f;
  {
    bench_config client_cfg{creds};
    caf::actor_system client{client_cfg};
    auto remote = connect_actor(client, "127.0.0.1", *port, std::chrono::seconds(5));
    if (!remote)
      throw std::runtime_error(client.render(remote.error()));
    caf::scoped_actor self{client};
    std::string msg(payload, 'x');
    std::vector<double> latency;
    for (int i = 0; i < 2000; ++i) {
      auto t0 = clock_type::now();
      self->request(*remote, std::chrono::seconds(10), msg)
        .receive([](const std::string&) {},
                 [&](caf::error& e) { throw std::runtime_error(client.render(e)); });
      latency.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    std::sort(latency.begin(), latency.end());
    f.p50_us = latency[latency.size() / 2];
    f.p99_us = latency[latency.size() * 99 / 100];
    // Pipelined: 100 in flight, 20,000 in all.
    constexpr int total = 20000;
    int sent = 0;
    int done = 0;
    auto t0 = clock_type::now();
    for (; sent < 100; ++sent)
      self->send(*remote, msg);
    while (done < total)
      self->receive([&](const std::string&) {
        ++done;
        if (sent < total) {
          self->send(*remote, msg);
          ++sent;
        }
      });
    f.per_second = total / std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  size_t payload = argc > 1 ? std::stoul(argv[1]) : 10000;
  int rounds = argc > 2 ? std::stoi(argv[2]) : 3;
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / fmt::format("mk_bench_tls_{}", std::random_device{}());
  auto init = init_cluster_credentials(dir.string());
  std::string error;
  auto creds = init.status == init_status::written
                 ? read_cluster_credentials((dir / token_file_name).string(), error)
                 : std::nullopt;
  if (!creds) {
    std::cerr << "bench_tls: " << (init.error.empty() ? error : init.error) << "\n";
    return 3;
  }
  std::cout << fmt::format("payload {} B, {} rounds (plain and TLS alternating)\n", payload,
                           rounds);
  for (int r = 0; r < rounds; ++r)
    for (bool tls : {false, true}) {
      auto f = run(tls ? &*creds : nullptr, payload);
      std::cout << fmt::format("{:5}  request/reply p50 {:6.1f} us  p99 {:6.1f} us  pipelined "
                               "(100 in flight) {:8.0f} msg/s\n",
                               tls ? "tls" : "plain", f.p50_us, f.p99_us, f.per_second);
    }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
