#include "cli/supervisor_command.hpp"

#include "cli/node_session.hpp"
#include "cli/submission_server.hpp"
#include "cli/token_file.hpp"
#include "config/cluster_config.hpp"
#include "search/state_dir.hpp"
#include "tpu_nodes/worker_options.hpp"

#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>

namespace maxkernel::cli {

namespace {

std::atomic<bool> stop_requested{false};

void on_signal(int) { stop_requested = true; }

bool resolve(const supervisor_command_options& opts, config::cluster_config& cfg,
             std::string& error) {
  if (!opts.config.empty()) {
    auto loaded = config::load_cluster_config(opts.config, error);
    if (!loaded)
      return false;
    cfg = *loaded;
  }
  if (!opts.listen.empty()
      && !config::parse_host_port(opts.listen, cfg.listen.host, cfg.listen.port, error)) {
    error = "--listen " + opts.listen + ": " + error;
    return false;
  }
  if (!opts.shell_listen.empty()
      && !config::parse_host_port(opts.shell_listen, cfg.shell_listen.host,
                                  cfg.shell_listen.port, error)) {
    error = "--shell-listen " + opts.shell_listen + ": " + error;
    return false;
  }
  if (!opts.state_dir.empty())
    cfg.state_dir = opts.state_dir;
  if (!opts.token_file.empty()) {
    cfg.token_file = opts.token_file;
    cfg.token_file_at.clear();
  }
  return true;
}

}  // namespace

int run_supervisor(const supervisor_command_options& opts) {
  config::cluster_config cfg;
  std::string error;
  if (!resolve(opts, cfg, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (cfg.state_dir.empty())
    cfg.state_dir = search::default_state_dir();
  if (cfg.state_dir.empty()) {
    std::cerr << "error: no state directory (no home): give --state-dir\n";
    return 2;
  }
  int code = 0;
  if (!cfg.token_file.empty()) {
    if (!load_token_file(cfg.token_file, std::cerr, code, cfg.token_file_given_by()))
      return code;
  } else {
    std::cerr << "warning: no --token-file: the node and client ports take any peer (run "
                 "`maxkernel cluster init DIR` and give --token-file DIR/token)\n";
  }
  // Candidates never see the credentials (docs/sandbox.md).
  if (!cfg.token_file.empty()) {
    tpu_nodes::hide_from_workers(cfg.token_file);
    tpu_nodes::hide_from_workers(std::filesystem::path(cfg.token_file).parent_path().string());
  }
  session_options so;
  so.role = session_options::cluster_role::supervisor;
  so.state_dir = cfg.state_dir;
  so.listen_host = cfg.listen.host;
  so.listen_port = cfg.listen.port;
  so.token_file = cfg.token_file;
  so.heartbeat = std::chrono::milliseconds(cfg.heartbeat_interval_ms);
  so.connection_timeout = std::chrono::milliseconds(cfg.connection_timeout_ms);
  so.deadline = std::chrono::milliseconds(static_cast<int64_t>(opts.deadline_seconds * 1000));
  node_session session(so);
  if (!session.start(error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  submission_server_config sc;
  sc.endpoint = fmt::format("tcp://{}:{}", cfg.shell_listen.host.find(':') != std::string::npos
                                             ? "[" + cfg.shell_listen.host + "]"
                                             : cfg.shell_listen.host,
                            cfg.shell_listen.port == 0 ? std::string("*")
                                                       : std::to_string(cfg.shell_listen.port));
  sc.state_dir = cfg.state_dir;
  sc.token_file = cfg.token_file;
  sc.resume = opts.resume;
  sc.node_endpoint = fmt::format("{}:{}", cfg.listen.host, session.listen_port());
  submission_server server(session, sc);
  if (!server.bind(error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  // One line a script can wait for and read the ports from.
  std::cerr << fmt::format("supervisor: nodes join at {}:{}; clients at {}; state in {}\n",
                           cfg.listen.host, session.listen_port(), server.endpoint(),
                           cfg.state_dir);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  server.serve(stop_requested);
  if (auto left = server.unfinished()) {
    // Waiting for them would wait for whole searches (their dispatcher is about to go, so
    // forever); cut short as by a kill, which the store and the search graphs survive.
    std::cerr << fmt::format("supervisor: stopped with {} run(s) unfinished; `maxkernel "
                             "supervisor --resume` with this state directory goes on with "
                             "them\n",
                             left);
    std::cerr.flush();
    std::_Exit(0);
  }
  std::cerr << "supervisor: stopped\n";
  return 0;
}

}  // namespace maxkernel::cli
