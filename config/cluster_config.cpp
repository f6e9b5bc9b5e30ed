#include "config/cluster_config.hpp"

#include "config/chip_names.hpp"
#include "config/field_reader.hpp"
#include "config/nearest_name.hpp"
#include "config/shown_value.hpp"
#include "config/yaml_config_file.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace maxkernel::config {

namespace {

namespace fs = std::filesystem;

constexpr const char* document_field = "(document)";
const std::vector<std::string> keys{
  "listen",  "shell_listen", "state_dir", "token_file", "heartbeat_interval_ms",
  "connection_timeout_ms", "join", "backend", "devices", "chip", "workers"};
const std::vector<std::string> backends{"model", "jax-tpu"};

// The limits catch unit mistakes (seconds written where milliseconds are meant, or the
// reverse) before a cluster waits an hour for a heartbeat.
constexpr int64_t max_heartbeat_ms = 60'000;
constexpr int64_t max_timeout_ms = 600'000;
constexpr int64_t max_devices = 4096;
constexpr int64_t max_workers = 1024;

host_port read_endpoint(const field_reader& r, const YAML::Node& n, const std::string& field,
                        bool allow_port_zero) {
  std::string text = r.text(n, field);
  host_port hp;
  std::string why;
  if (!parse_host_port(text, hp.host, hp.port, why))
    r.fail(n, field, why);
  if (hp.port == 0 && !allow_port_zero)
    r.fail(n, field,
           fmt::format("port 0 in '{}' names no port to connect to; give the supervisor's "
                       "node port (like 127.0.0.1:7400)",
                       shown_value(text)));
  return hp;
}

int64_t read_count(const field_reader& r, const YAML::Node& n, const std::string& field,
                   int64_t low, int64_t high, const char* unit) {
  int64_t v = r.integer(n, field);
  if (v < low || v > high)
    r.fail(n, field, fmt::format("expected {} from {} to {}, got {}", unit, low, high, v));
  return v;
}

// A path in the file means a path next to the file, wherever the process was started.
std::string read_path(const field_reader& r, const YAML::Node& n, const std::string& field,
                      const std::string& file) {
  std::string text = r.text(n, field);
  if (text.empty())
    return text;
  if (text.find('\0') != std::string::npos)
    r.fail(n, field, "the path contains a NUL byte");
  fs::path p(text);
  if (p.is_relative()) {
    std::error_code ec;
    fs::path base = fs::absolute(fs::path(file).parent_path(), ec);
    if (ec)
      r.fail(n, field, fmt::format("cannot resolve '{}' against the config's directory: {}",
                                   shown_value(text), ec.message()));
    p = base / p;
  }
  return p.lexically_normal().string();
}

std::string read_chip(const field_reader& r, const YAML::Node& n, const std::string& field) {
  std::string name = r.string(n, field);
  if (!is_chip_name(name))
    r.fail(n, field, fmt::format("'{}' is not a chip name (like v6e)", shown_value(name)));
  auto known = chip_names();
  if (!known.empty() && std::find(known.begin(), known.end(), name) == known.end()) {
    std::string hint = nearest_name(name, known);
    r.fail(n, field,
           fmt::format("unknown chip '{}'{}; known: {}", shown_value(name),
                       hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                       join_names(known)));
  }
  return name;
}

cluster_config parse(const YAML::Node& root, const field_reader& r, const std::string& file) {
  cluster_config c;
  if (!root.IsDefined() || root.IsNull())
    return c;  // an empty file: every default
  if (!root.IsMap())
    r.fail(root, document_field,
           fmt::format("a cluster config is a mapping (listen: HOST:PORT, ...), got {}",
                       field_reader::describe(root)));
  auto m = r.mapping(root, "", keys);
  bool join_given = false;
  for (const auto& e : m.entries) {
    const std::string& f = e.key;
    const YAML::Node& v = e.value;
    if (f == "listen") {
      c.listen = read_endpoint(r, v, f, true);
    } else if (f == "shell_listen") {
      c.shell_listen = read_endpoint(r, v, f, true);
    } else if (f == "join") {
      c.join = read_endpoint(r, v, f, false);
      join_given = true;
    } else if (f == "state_dir") {
      c.state_dir = read_path(r, v, f, file);
    } else if (f == "token_file") {
      c.token_file = read_path(r, v, f, file);
      auto mark = v.Mark();
      c.token_file_at = mark.line >= 0
                          ? fmt::format("{}:{}:{}: token_file", file, mark.line + 1, mark.column + 1)
                          : file + ": token_file";
    } else if (f == "heartbeat_interval_ms") {
      c.heartbeat_interval_ms =
        static_cast<uint32_t>(read_count(r, v, f, 1, max_heartbeat_ms, "milliseconds"));
    } else if (f == "connection_timeout_ms") {
      c.connection_timeout_ms =
        static_cast<uint32_t>(read_count(r, v, f, 1, max_timeout_ms, "milliseconds"));
    } else if (f == "backend") {
      c.backend = r.string(v, f);
      if (std::find(backends.begin(), backends.end(), c.backend) == backends.end())
        r.fail(v, f, fmt::format("unknown backend '{}'; a backend is model or jax-tpu",
                                 shown_value(c.backend)));
    } else if (f == "devices") {
      c.devices = static_cast<uint32_t>(read_count(r, v, f, 1, max_devices, "a device count"));
    } else if (f == "chip") {
      c.chip = read_chip(r, v, f);
    } else if (f == "workers") {
      c.workers = static_cast<uint32_t>(
        read_count(r, v, f, 0, max_workers, "a worker count (0: one per core)"));
    }
  }
  // A timeout at or below the heartbeat interval would drop every healthy peer.
  if (c.connection_timeout_ms <= c.heartbeat_interval_ms) {
    const yaml_entry* e = m.find("connection_timeout_ms");
    if (!e)
      e = m.find("heartbeat_interval_ms");
    r.fail(e->value, e->key,
           fmt::format("connection_timeout_ms ({}) must exceed heartbeat_interval_ms ({}): a "
                       "peer is dropped after a timeout without heartbeats",
                       c.connection_timeout_ms, c.heartbeat_interval_ms));
  }
  if (!join_given) {
    c.join = c.listen;  // a node on the supervisor's host
    if (c.join.port == 0)
      c.join.port = 7400;
  }
  return c;
}

}  // namespace

std::string host_port::to_string() const {
  if (host.find(':') != std::string::npos)
    return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

bool parse_host_port(const std::string& text, std::string& host, uint16_t& port,
                     std::string& error) {
  const std::string shown = shown_value(text);
  auto fail = [&](const std::string& why) {
    error = fmt::format("'{}' is not HOST:PORT ({})", shown, why);
    return false;
  };
  if (text.empty())
    return fail("it is empty; like 127.0.0.1:7400");
  std::string h;
  std::string p;
  if (text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos)
      return fail("an IPv6 host opened with '[' is not closed with ']'");
    h = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':')
      return fail("no ':PORT' after the bracketed host");
    p = text.substr(close + 2);
    if (h.empty() || h.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos)
      return fail("the bracketed host is not an IPv6 address");
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos)
      return fail("no ':PORT'; like 127.0.0.1:7400");
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
    if (h.find(':') != std::string::npos)
      return fail("an IPv6 host goes in brackets, like [::1]:7400");
    if (h.empty())
      return fail("no host before ':'; like 127.0.0.1:7400 or 0.0.0.0:7400 for every interface");
    for (char ch : h)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_')
        return fail(fmt::format("the host contains '{}'", shown_value(std::string(1, ch))));
  }
  if (p.empty())
    return fail("no port after ':'");
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
    if (!p.empty() && p.find_first_not_of("0123456789") == std::string::npos)
      return fail(fmt::format("port {} is out of range 0-65535", shown_value(p)));
    return fail(fmt::format("the port '{}' is not a number", shown_value(p)));
  }
  unsigned long v = std::stoul(p);
  if (v > 65535)
    return fail(fmt::format("port {} is out of range 0-65535", v));
  host = std::move(h);
  port = static_cast<uint16_t>(v);
  return true;
}

std::optional<cluster_config> parse_cluster_config(const std::string& text,
                                                   const std::string& file,
                                                   std::string& error) {
  cluster_config c;
  field_reader reader(file);
  if (!parse_config_document(text, file, "the cluster config",
                             [&](const YAML::Node& root) { c = parse(root, reader, file); }, error))
    return std::nullopt;
  c.source_path = file;
  return c;
}

std::optional<cluster_config> load_cluster_config(const std::string& path, std::string& error) {
  auto text = read_config_file(path, error);
  if (!text)
    return std::nullopt;
  return parse_cluster_config(*text, path, error);
}

}  // namespace maxkernel::config
