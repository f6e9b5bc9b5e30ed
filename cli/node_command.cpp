#include "cli/node_command.hpp"

#include "cli/node_session.hpp"
#include "cli/token_file.hpp"
#include "cluster/secure_transport.hpp"
#include "config/cluster_config.hpp"
#include "messages/dispatcher_actor.hpp"
#include "messages/error.hpp"
#include "search/evaluation_store.hpp"
#include "search/state_dir.hpp"
#include "tpu_nodes/worker_options.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

namespace maxkernel::cli {

namespace {

std::atomic<bool> stop_requested{false};

void on_signal(int) { stop_requested = true; }

// What the node runs with: the flags over cluster.yaml over the defaults.
bool resolve(const node_command_options& opts, config::cluster_config& cfg, std::string& error) {
  if (!opts.config.empty()) {
    auto loaded = config::load_cluster_config(opts.config, error);
    if (!loaded)
      return false;
    cfg = *loaded;
  }
  if (!opts.join.empty()) {
    if (!config::parse_host_port(opts.join, cfg.join.host, cfg.join.port, error)) {
      error = "--join " + opts.join + ": " + error;
      return false;
    }
  }
  if (cfg.join.port == 0) {
    error = "--join: the supervisor's node port is needed (HOST:PORT, port 1-65535)";
    return false;
  }
  if (!opts.token_file.empty()) {
    cfg.token_file = opts.token_file;
    cfg.token_file_at.clear();
  }
  if (!opts.backend.empty())
    cfg.backend = opts.backend;
  if (cfg.backend != "model" && cfg.backend != "jax-tpu") {
    error = "--backend " + cfg.backend + ": one of model, jax-tpu";
    return false;
  }
  if (opts.devices > 0)
    cfg.devices = opts.devices;
  if (!opts.chip.empty())
    cfg.chip = opts.chip;
  if (opts.workers >= 0)
    cfg.workers = static_cast<uint32_t>(opts.workers);
  return true;
}

enum class joined { stopped, lost, refused, failed };

// Connects to the supervisor, registers every device and waits until the supervisor goes
// away or the node is asked to stop.
joined join_once(node_session& session, const config::cluster_config& cfg, bool& announced,
                 std::string& why) {
  auto& sys = session.system();
  auto remote = cluster::connect_actor(sys, cfg.join.host, cfg.join.port,
                                       std::chrono::seconds(5),
                                       sys.message_types<messages::dispatcher_actor>());
  if (!remote) {
    why = messages::message_of(remote.error());
    if (cluster::authentication_failed(remote.error()))
      return joined::refused;
    return joined::failed;
  }
  auto dispatcher = caf::actor_cast<messages::dispatcher_actor>(*remote);
  caf::scoped_actor self{sys};
  // Each device joins with its NodeInfo: its chip and backend decide which requests it gets.
  for (auto& node : session.local_nodes()) {
    std::optional<messages::payload> info;
    self->request(node, std::chrono::seconds(10), messages::info_atom::value)
      .receive([&](messages::payload& p) { info = std::move(p); }, [](caf::error&) {});
    if (info)
      self->send(dispatcher, messages::join_atom::value, caf::actor_cast<caf::actor>(node), *info);
    else
      self->send(dispatcher, messages::join_atom::value, caf::actor_cast<caf::actor>(node));
  }
  std::cerr << fmt::format("node: joined {} with {} device(s)\n", cfg.join.to_string(),
                           session.local_nodes().size());
  announced = false;
  self->monitor(*remote);
  bool lost = false;
  while (!lost && !stop_requested)
    self->receive([&](caf::down_msg&) { lost = true; },
                  caf::after(std::chrono::milliseconds(200)) >> [] {});
  return lost ? joined::lost : joined::stopped;
}

}  // namespace

int run_node(const node_command_options& opts) {
  config::cluster_config cfg;
  std::string error;
  if (!resolve(opts, cfg, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  int code = 0;
  if (!cfg.token_file.empty() &&
      !load_token_file(cfg.token_file, std::cerr, code, cfg.token_file_given_by()))
    return code;
  if (!opts.state_dir.empty()) {
    // A store that does not open is bad input, told apart from a worker that does not start.
    auto store = search::evaluation_store::open(search::default_store_path(opts.state_dir), error);
    if (!store) {
      std::cerr << "error: --state-dir " << opts.state_dir << ": " << error << "\n";
      return 2;
    }
  }
  // Candidates never see the credentials or the node's state (docs/sandbox.md).
  if (!cfg.token_file.empty()) {
    tpu_nodes::hide_from_workers(cfg.token_file);
    tpu_nodes::hide_from_workers(std::filesystem::path(cfg.token_file).parent_path().string());
  }
  if (!opts.state_dir.empty())
    tpu_nodes::hide_from_workers(opts.state_dir);
  session_options so;
  so.role = session_options::cluster_role::node;
  so.backend = cfg.backend;
  so.chip = cfg.chip;
  so.nodes = cfg.devices;
  so.workers = cfg.workers;
  so.use_store = !opts.state_dir.empty();  // a host-local cache of repeats
  so.state_dir = opts.state_dir;
  so.token_file = cfg.token_file;
  so.heartbeat = std::chrono::milliseconds(cfg.heartbeat_interval_ms);
  so.connection_timeout = std::chrono::milliseconds(cfg.connection_timeout_ms);
  so.simulate_device = std::chrono::milliseconds(opts.simulate_device_ms);
  so.memory_limit_bytes = opts.memory_limit_bytes;
  so.deadline = std::chrono::milliseconds(static_cast<int64_t>(opts.deadline_seconds * 1000));
  node_session session(so);
  if (!session.start(error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  std::cerr << fmt::format("node: {} device(s) ({} backend, {}), {} worker(s), JAX {}{}\n",
                           cfg.devices, session.backend(), cfg.chip, session.workers(),
                           session.jax_version(),
                           session.store_path().empty()
                             ? ""
                             : ", host-local store " + session.store_path());
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  bool announced = false;
  auto retry = std::chrono::milliseconds(static_cast<int64_t>(opts.retry_seconds * 1000));
  while (!stop_requested) {
    std::string why;
    switch (join_once(session, cfg, announced, why)) {
      case joined::stopped:
        break;
      case joined::refused:
        std::cerr << "error: authentication failed at " << cfg.join.to_string() << ": " << why
                  << "\n";
        return 3;
      case joined::lost:
        std::cerr << "node: lost the supervisor at " << cfg.join.to_string()
                  << "; joining again when it is back\n";
        break;
      case joined::failed:
        if (!announced)
          std::cerr << "node: waiting for the supervisor at " << cfg.join.to_string() << " ("
                    << why << ")\n";
        announced = true;
        for (auto slept = std::chrono::milliseconds(0); slept < retry && !stop_requested;
             slept += std::chrono::milliseconds(50))
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        break;
    }
  }
  std::cerr << "node: stopped\n";
  return 0;
}

}  // namespace maxkernel::cli
