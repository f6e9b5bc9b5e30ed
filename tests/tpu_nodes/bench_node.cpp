// Benchmark (not a test): evaluations answered from the evaluation store through a tpu_node,
// client -> node -> client, on this machine. One real evaluation fills the store first; then
// the same request is sent pipelined (many in flight) and one at a time.
//   bench_node [requests] [in-flight] [CAF options, e.g. --scheduler.policy=sharing]
#include "maxkernel/schema/eval.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"
#include "search/evaluation_store.hpp"
#include "tests/support/eval_requests.hpp"
#include "tpu_nodes/tpu_node.hpp"
#include "tpu_nodes/worker_pool.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <vector>

using namespace maxkernel;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

int main(int argc, char** argv) {
  uint64_t total = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200'000;
  unsigned window = argc > 2 ? static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10)) : 256;
  caf::actor_system_config cfg;
  messages::register_types(cfg);
  if (argc > 3) {
    if (auto err = cfg.parse(argc - 3, argv + 3)) {
      std::cerr << "bench_node: " << cfg.render(err) << "\n";
      return 2;
    }
  }
  caf::actor_system sys{cfg};
  std::string err;
  auto store = search::evaluation_store::open(":memory:", err);
  if (!store) {
    std::cerr << "bench_node: " << err << "\n";
    return 3;
  }
  tpu_nodes::pool_config pc;
  pc.workers = 1;
  auto pool = tpu_nodes::spawn_worker_pool(sys, pc);
  tpu_nodes::node_config nc;
  nc.node_id = "bench:0";
  nc.store = store.get();
  nc.queue_capacity = window;
  auto node = tpu_nodes::spawn_tpu_node(sys, nc, pool);
  auto request = test_support::eval_request(test_support::test_kernel("matmul"));

  int status = 0;
  {
    caf::scoped_actor self{sys};
    // Fill the store with one real evaluation.
    bool filled = false;
    self->request(node, 600s, messages::evaluate_atom::value, request)
      .receive([&](messages::payload&) { filled = true; },
               [&](caf::error& e) { std::cerr << "bench_node: " << caf::to_string(e) << "\n"; });
    if (!filled || store->size() != 1) {
      std::cerr << "bench_node: the first evaluation was not recorded\n";
      status = 3;
    } else {
      // Pipelined: `window` requests in flight, a new one for each reply.
      uint64_t sent = 0, received = 0, errors = 0;
      auto start = clock_type::now();
      for (; sent < std::min<uint64_t>(window, total); ++sent)
        self->send(node, messages::evaluate_atom::value, request);
      self->receive_while([&] { return received < total; })(
        [&](messages::payload&) {
          ++received;
          if (sent < total) {
            self->send(node, messages::evaluate_atom::value, request);
            ++sent;
          }
        },
        [&](caf::error&) {
          ++received;
          ++errors;
        });
      double pipelined_s = std::chrono::duration<double>(clock_type::now() - start).count();

      // One at a time.
      uint64_t serial = std::max<uint64_t>(total / 10, 1);
      std::vector<double> us;
      us.reserve(serial);
      for (uint64_t i = 0; i < serial; ++i) {
        auto t0 = clock_type::now();
        self->request(node, 60s, messages::evaluate_atom::value, request)
          .receive([&](messages::payload&) {}, [&](caf::error&) { ++errors; });
        us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
      }
      std::sort(us.begin(), us.end());
      auto pct = [&](double q) { return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))]; };
      fmt::print("bench_node: store hits through one tpu_node: pipelined {:.0f} req/s ({} requests, "
                 "{} in flight); one at a time p50 {:.0f} us, p99 {:.0f} us ({} requests, "
                 "{:.0f} req/s); errors {}; store hits {}\n",
                 total / pipelined_s, total, window, pct(0.5), pct(0.99), serial,
                 1e6 * serial / std::max(1.0, [&] { double s = 0; for (auto u : us) s += u; return s; }()),
                 errors, store->hits());
      status = errors == 0 ? 0 : 1;
    }
    self->send_exit(node, caf::exit_reason::user_shutdown);
    self->send_exit(pool, caf::exit_reason::user_shutdown);
  }
  return status;
}
