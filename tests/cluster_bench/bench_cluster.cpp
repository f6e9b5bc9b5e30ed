// Benchmark (not a test, not registered with ctest): evaluations per second through
// supervisor -> remote node -> supervisor, as a cluster's supervisor sends them. Issue 8
// ("Benchmark"); scripts/bench-cluster runs it and docs/performance.md ("Cluster") records
// the figures.
//
// This process plays the supervisor's part: an actor system with CAF's middleman (mutual TLS
// with --token-file, as `maxkernel supervisor`), the dispatcher (cluster/dispatcher, waiting
// for nodes, the supervisor's configuration) published on the node port with
// cluster::publish_actor, and a client that keeps --in-flight EvalRequests at it. The nodes
// are real `maxkernel node` processes (started by the script once the port is written to
// --port-file) with a host-local store: every request is the same (the spec's, for the
// kernel file), so the first is evaluated by a node's JAX worker and recorded, and the nodes
// answer the rest from the store (on --simulate-device-ms nodes a store hit still occupies
// the simulated device). Not here: the store in front of the dispatcher (tpu_nodes/
// store_front) would answer repeats itself, so the supervisor's own store is left out.
//
// Prints one line: nodes, node processes, rate, supervisor CPU per evaluation (getrusage of
// this whole process over the timed window: dispatcher, middleman, client), and with a
// simulated device the efficiency rate / (nodes x 1000 / device ms).
//
//   bench_cluster SPEC.yaml KERNEL.py --nodes=K [--evaluations=M] [--in-flight=F]
//                 [--credits=C] [--token-file=F] [--port-file=PATH] [--json]
//                 [CAF options, e.g. --scheduler.policy=sharing]
#include "cluster/cluster_credentials.hpp"
#include "cluster/dispatcher.hpp"
#include "cluster/secure_transport.hpp"
#include "config/native_spec_loader.hpp"
#include "maxkernel/schema/cluster.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "messages/error.hpp"
#include "messages/eval_request.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <fmt/format.h>

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

using namespace maxkernel;
using namespace std::chrono_literals;

namespace {

struct options {
  std::string spec_path, kernel_path, token_file, port_file;
  unsigned nodes = 1;
  uint64_t evaluations = 2000;
  unsigned in_flight = 0;  // 0: 2 x nodes
  unsigned credits = 0;    // 0: the dispatcher's default
  bool json = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "bench_cluster: " << why
            << "\nusage: bench_cluster SPEC.yaml KERNEL.py --nodes=K [--evaluations=M] "
               "[--in-flight=F] [--credits=C] [--token-file=F] [--port-file=PATH] [--json] "
               "[CAF options]\n";
  std::exit(2);
}

options parse(int argc, char** argv, std::vector<char*>& caf_args) {
  options o;
  std::vector<std::string> positional;
  caf_args.push_back(argv[0]);
  auto number = [](const std::string& arg, const std::string& v) {
    try {
      size_t used = 0;
      auto n = std::stoull(v, &used);
      if (used != v.size() || n == 0)
        throw std::invalid_argument(v);
      return n;
    } catch (const std::exception&) {
      usage(arg + ": a positive integer");
    }
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string key = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (key == "--nodes")
      o.nodes = static_cast<unsigned>(number(a, value));
    else if (key == "--evaluations")
      o.evaluations = number(a, value);
    else if (key == "--in-flight")
      o.in_flight = static_cast<unsigned>(number(a, value));
    else if (key == "--credits")
      o.credits = static_cast<unsigned>(number(a, value));
    else if (key == "--token-file")
      o.token_file = value;
    else if (key == "--port-file")
      o.port_file = value;
    else if (a == "--json")
      o.json = true;
    else if (a.rfind("--", 0) == 0 && key.find('.') != std::string::npos)
      caf_args.push_back(argv[i]);  // CAF's own, e.g. --scheduler.policy=sharing
    else if (a.rfind("--", 0) == 0)
      usage("unknown option " + a);
    else
      positional.push_back(a);
  }
  if (positional.size() != 2)
    usage("SPEC.yaml and KERNEL.py are needed");
  o.spec_path = positional[0];
  o.kernel_path = positional[1];
  if (o.in_flight == 0)
    o.in_flight = 2 * o.nodes;
  return o;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct run_counts {
  uint64_t ok = 0, cached = 0, errors = 0;
  std::string first_error;
};

// Keeps `in_flight` evaluations of `request` at the dispatcher until `total` were answered,
// then sends the counts to `report`.
caf::behavior client(caf::event_based_actor* self, messages::dispatcher_actor dispatcher,
                     messages::payload request, uint64_t total, unsigned in_flight,
                     caf::actor report) {
  auto counts = std::make_shared<run_counts>();
  auto sent = std::make_shared<uint64_t>(0);
  auto send_one = std::make_shared<std::function<void()>>();
  *send_one = [=] {
    if (*sent >= total)
      return;
    ++*sent;
    auto done = [=] {
      if (counts->ok + counts->errors == total) {
        self->send(report, counts->ok, counts->cached, counts->errors, counts->first_error);
        self->quit();
        return;
      }
      (*send_one)();
    };
    self->request(dispatcher, std::chrono::minutes(15), messages::evaluate_atom::value, request,
                  uint32_t{600'000})
      .then(
        [=](messages::payload& p) {
          ++counts->ok;
          std::string err;
          if (auto m = messages::open_payload<schema::EvalResult>(p, err))
            counts->cached += m->root<schema::EvalResult>().getCached() ? 1 : 0;
          done();
        },
        [=](caf::error& e) {
          if (counts->errors++ == 0)
            counts->first_error = messages::message_of(e);
          done();
        });
  };
  for (unsigned i = 0; i < in_flight; ++i)
    (*send_one)();
  return {[](int) {}};  // never called: the actor lives by its requests' handlers
}

struct node_view {
  unsigned alive = 0;
  std::set<std::string> processes;  // host:pid of the node ids (host:pid:device)
};

node_view nodes_of(caf::actor_system& sys, const messages::dispatcher_actor& d) {
  node_view v;
  caf::scoped_actor self{sys};
  self->request(d, 5s, messages::status_atom::value)
    .receive(
      [&](messages::payload& p) {
        std::string err;
        auto m = messages::open_payload<schema::DispatcherStatus>(p, err);
        if (!m)
          return;
        for (auto n : m->root<schema::DispatcherStatus>().getNodes()) {
          if (!n.getAlive())
            continue;
          ++v.alive;
          std::string id = n.getNodeId().cStr();
          v.processes.insert(id.substr(0, id.rfind(':')));
        }
      },
      [](caf::error&) {});
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> caf_args;
  auto o = parse(argc, argv, caf_args);
  capnp::MallocMessageBuilder spec_msg;
  config::spec_error spec_err;
  if (!config::load_native_spec(o.spec_path, {}, spec_msg.initRoot<schema::KernelSpec>(),
                                spec_err)) {
    std::cerr << "bench_cluster: " << spec_err.what() << "\n";
    return 2;
  }
  std::ifstream kf(o.kernel_path);
  if (!kf) {
    std::cerr << "bench_cluster: cannot read " << o.kernel_path << "\n";
    return 2;
  }
  std::stringstream source;
  source << kf.rdbuf();
  capnp::MallocMessageBuilder req_msg;
  messages::build_eval_request(req_msg.initRoot<schema::EvalRequest>(),
                               spec_msg.getRoot<schema::KernelSpec>().asReader(), source.str(),
                               "bench_cluster", {});
  auto request = messages::make_payload<schema::EvalRequest>(req_msg);

  caf::actor_system_config cfg;
  messages::register_types(cfg);
  cfg.load<caf::io::middleman>();
  if (auto err = cfg.parse(static_cast<int>(caf_args.size()), caf_args.data())) {
    std::cerr << "bench_cluster: " << cfg.render(err) << "\n";
    return 2;
  }
  // As `maxkernel supervisor` (cluster.yaml's defaults).
  cfg.set("middleman.heartbeat-interval", caf::timespan{200ms});
  cfg.set("middleman.connection-timeout", caf::timespan{1000ms});
  if (!o.token_file.empty()) {
    std::string error;
    auto creds = cluster::read_cluster_credentials(o.token_file, error);
    if (!creds) {
      std::cerr << "bench_cluster: --token-file: " << error << "\n";
      return 2;
    }
    cluster::enable_cluster_tls(cfg, *creds);
  }
  caf::actor_system sys{cfg};
  cluster::dispatcher_config dc;
  dc.wait_for_nodes = true;
  if (o.credits > 0)
    dc.credits_per_node = o.credits;
  auto dispatcher = cluster::spawn_dispatcher(sys, {}, dc);
  auto port = cluster::publish_actor(sys, caf::actor_cast<caf::actor>(dispatcher), "127.0.0.1", 0,
                                     sys.message_types(dispatcher));
  if (!port) {
    std::cerr << "bench_cluster: cannot publish: " << messages::message_of(port.error()) << "\n";
    return 3;
  }
  std::cerr << "bench_cluster: node port " << *port << "\n";
  if (!o.port_file.empty()) {  // written whole, then renamed: the script never reads half
    std::ofstream(o.port_file + ".tmp") << *port << "\n";
    std::filesystem::rename(o.port_file + ".tmp", o.port_file);
  }
  caf::scoped_actor self{sys};
  auto stop = [&](int code) {
    self->send_exit(dispatcher, caf::exit_reason::user_shutdown);
    return code;
  };

  auto give_up = std::chrono::steady_clock::now() + 10min;
  node_view view;
  while ((view = nodes_of(sys, dispatcher)).alive < o.nodes) {
    if (std::chrono::steady_clock::now() > give_up) {
      std::cerr << "bench_cluster: only " << view.alive << " of " << o.nodes
                << " nodes joined within 10 minutes\n";
      return stop(3);
    }
    std::this_thread::sleep_for(50ms);
  }
  uint32_t device_ms = 0;
  self->request(dispatcher, 30s, messages::info_atom::value)
    .receive(
      [&](messages::payload& p) {
        std::string err;
        if (auto m = messages::open_payload<schema::NodeInfo>(p, err))
          device_ms = m->root<schema::NodeInfo>().getSimulatedDeviceMs();
      },
      [](caf::error&) {});

  // Warm-up, untimed: the first request fills the nodes' store when it is empty (a real
  // evaluation); then one round at every node.
  auto run = [&](uint64_t total, unsigned in_flight) {
    run_counts c;
    sys.spawn(client, dispatcher, request, total, in_flight, caf::actor{self});
    self->receive([&](uint64_t ok, uint64_t cached, uint64_t errors, std::string& first_error) {
      c = run_counts{ok, cached, errors, first_error};
    });
    return c;
  };
  auto t0 = std::chrono::steady_clock::now();
  auto first = run(1, 1);
  auto first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (first.errors > 0) {
    std::cerr << "bench_cluster: the first evaluation failed: " << first.first_error << "\n";
    return stop(3);
  }
  std::cerr << fmt::format("bench_cluster: first evaluation {} in {:.2f} s\n",
                           first.cached ? "from the store" : "evaluated (stored)", first_s);
  run(2 * o.nodes, o.in_flight);

  double cpu0 = cpu_seconds();
  auto w0 = std::chrono::steady_clock::now();
  auto c = run(o.evaluations, o.in_flight);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  double cpu = cpu_seconds() - cpu0;
  double rate = static_cast<double>(c.ok) / wall;
  double cpu_us = 1e6 * cpu / static_cast<double>(o.evaluations);
  double ideal = device_ms > 0 ? o.nodes * 1000.0 / device_ms : 0;
  std::string transport = o.token_file.empty() ? "plain" : "tls";
  std::string eff = ideal > 0 ? fmt::format("{:.3f}", rate / ideal) : "null";
  if (o.json) {
    std::cout << fmt::format(
      "{{\"nodes\": {}, \"processes\": {}, \"transport\": \"{}\", \"device_ms\": {}, "
      "\"in_flight\": {}, \"evaluations\": {}, \"cached\": {}, \"errors\": {}, "
      "\"wall_s\": {:.3f}, \"rate_per_s\": {:.1f}, \"cpu_s\": {:.3f}, \"cpu_us_per_eval\": "
      "{:.1f}, \"efficiency\": {}}}\n",
      o.nodes, view.processes.size(), transport, device_ms, o.in_flight, o.evaluations,
      c.cached, c.errors, wall, rate, cpu, cpu_us, eff);
  } else {
    std::cout << fmt::format(
      "nodes {:>3} over {} process(es), {}, device {} ms, {} in flight: {} evaluations "
      "({} from the store, {} errors) in {:.2f} s = {:.1f}/s; supervisor CPU {:.2f} s = {:.1f} "
      "us/evaluation{}\n",
      o.nodes, view.processes.size(), transport, device_ms, o.in_flight, o.evaluations,
      c.cached, c.errors, wall, rate, cpu, cpu_us,
      ideal > 0 ? ", efficiency " + eff : "");
  }
  if (c.errors > 0)
    std::cerr << "bench_cluster: " << c.errors << " errors, the first: " << c.first_error << "\n";
  return stop(c.errors > 0 ? 1 : 0);
}
