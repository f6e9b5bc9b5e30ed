// cluster.yaml (docs/cluster.md): what the supervisor, node and shell processes of one cluster
// read. Every field also has a command-line flag that wins over the file; the loader only
// reads and validates, it never opens a port or a credential.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace maxkernel::config {

// A TCP endpoint as written by users: HOST:PORT, with an IPv6 host in brackets ([::1]:7400).
struct host_port {
  std::string host;
  uint16_t port = 0;

  std::string to_string() const;  // brackets an IPv6 host again
};

struct cluster_config {
  // supervisor
  host_port listen{"127.0.0.1", 7400};        // node port (CAF middleman, mutual TLS)
  host_port shell_listen{"127.0.0.1", 7401};  // client port (ZeroMQ, CURVE)
  // Paths in the file are relative to the file's directory (made absolute when read).
  std::string state_dir;  // "" = the default state directory
  // every process
  std::string token_file;  // "" = none given (a process then needs --token-file)
  std::string token_file_at;  // "FILE:LINE:COLUMN: token_file" when the file gave it
  // Where token_file came from, for messages.
  std::string token_file_given_by() const {
    return token_file_at.empty() ? "--token-file" : token_file_at;
  }
  // A frozen host is noticed within the timeout; a host whose CPUs its JAX workers saturate
  // (compiles, interpret-mode tests) can go silent for a second or more without being lost.
  uint32_t heartbeat_interval_ms = 500;
  uint32_t connection_timeout_ms = 5000;
  // node
  host_port join{"127.0.0.1", 7400};  // the supervisor's node port; defaults to `listen`
  std::string backend = "model";      // model | jax-tpu
  uint32_t devices = 4;
  std::string chip = "v6e";
  uint32_t workers = 0;  // 0 = one per core
  std::string source_path;  // the file read; "" for the defaults
};

// Parses HOST:PORT. The host is a name or an IPv4 address, or an IPv6 address in brackets;
// the port is 0-65535 (0 lets a listener take any free port; the caller refuses it where a
// real port is needed, as for --join). On failure returns false with `error` saying why.
bool parse_host_port(const std::string& text, std::string& host, uint16_t& port,
                     std::string& error);

// Reads and validates a cluster.yaml. Unknown keys, wrong types, a bad HOST:PORT, a port out
// of range: nullopt with `error` as "FILE:LINE:COLUMN: FIELD: MESSAGE". Never throws.
std::optional<cluster_config> load_cluster_config(const std::string& path, std::string& error);

// The same on text already read; `file` labels errors and anchors a relative token_file.
std::optional<cluster_config> parse_cluster_config(const std::string& text,
                                                   const std::string& file, std::string& error);

}  // namespace maxkernel::config
