// cluster.yaml: the example as shipped, defaults, relative paths, HOST:PORT parsing, and each
// bad field failing with its line and field.
#include "config/cluster_config.hpp"

#include <gtest/gtest.h>

#include <filesystem>

namespace maxkernel::config::test {
namespace {

namespace fs = std::filesystem;

cluster_config parse_ok(const std::string& text, const std::string& file = "/etc/mk/c.yaml") {
  std::string error;
  auto c = parse_cluster_config(text, file, error);
  EXPECT_TRUE(c.has_value()) << error;
  return c.value_or(cluster_config{});
}

std::string parse_bad(const std::string& text) {
  std::string error;
  auto c = parse_cluster_config(text, "c.yaml", error);
  EXPECT_FALSE(c.has_value()) << text;
  return error;
}

TEST(ClusterConfig, TheExampleLoadsAsShipped) {
  std::string path = std::string(MAXKERNEL_SOURCE_DIR) + "/config/cluster.example.yaml";
  std::string error;
  auto c = load_cluster_config(path, error);
  ASSERT_TRUE(c.has_value()) << error;
  EXPECT_EQ(c->listen.to_string(), "127.0.0.1:7400");
  EXPECT_EQ(c->shell_listen.to_string(), "127.0.0.1:7401");
  EXPECT_EQ(c->join.to_string(), "127.0.0.1:7400");
  EXPECT_EQ(fs::path(c->token_file),
            (fs::path(MAXKERNEL_SOURCE_DIR) / "config/cluster/token").lexically_normal());
  EXPECT_EQ(c->backend, "model");
  EXPECT_EQ(c->chip, "v6e");
}

TEST(ClusterConfig, EmptyFileGivesTheDefaults) {
  auto c = parse_ok("# nothing\n");
  EXPECT_EQ(c.listen.host, "127.0.0.1");
  EXPECT_EQ(c.listen.port, 7400);
  EXPECT_EQ(c.shell_listen.port, 7401);
  EXPECT_EQ(c.heartbeat_interval_ms, 500u);
  EXPECT_EQ(c.connection_timeout_ms, 5000u);
  EXPECT_EQ(c.devices, 4u);
  EXPECT_EQ(c.workers, 0u);
  EXPECT_EQ(c.token_file, "");
}

TEST(ClusterConfig, ValuesAndRelativePaths) {
  auto c = parse_ok(R"(
listen: 0.0.0.0:9000
shell_listen: "[::1]:9001"
state_dir: state
token_file: ../creds/token
heartbeat_interval_ms: 50
connection_timeout_ms: 400
backend: jax-tpu
devices: 8
chip: v5e
workers: 3
)",
                    "/etc/mk/c.yaml");
  EXPECT_EQ(c.listen.host, "0.0.0.0");
  EXPECT_EQ(c.listen.port, 9000);
  EXPECT_EQ(c.shell_listen.host, "::1");
  EXPECT_EQ(c.shell_listen.to_string(), "[::1]:9001");
  EXPECT_EQ(c.state_dir, "/etc/mk/state");
  EXPECT_EQ(c.token_file, "/etc/creds/token");
  EXPECT_EQ(c.join.to_string(), "0.0.0.0:9000");  // join defaults to listen
  EXPECT_EQ(c.heartbeat_interval_ms, 50u);
  EXPECT_EQ(c.connection_timeout_ms, 400u);
  EXPECT_EQ(c.backend, "jax-tpu");
  EXPECT_EQ(c.devices, 8u);
  EXPECT_EQ(c.chip, "v5e");
  EXPECT_EQ(c.workers, 3u);
  EXPECT_EQ(parse_ok("token_file: /abs/token\n").token_file, "/abs/token");
  EXPECT_EQ(parse_ok("join: tpu-host-3.internal:7400\n").join.host, "tpu-host-3.internal");
}

TEST(ClusterConfig, ParseHostPort) {
  std::string host, error;
  uint16_t port = 0;
  ASSERT_TRUE(parse_host_port("localhost:65535", host, port, error)) << error;
  EXPECT_EQ(host, "localhost");
  EXPECT_EQ(port, 65535);
  ASSERT_TRUE(parse_host_port("10.0.0.1:0", host, port, error));
  EXPECT_EQ(port, 0);
  ASSERT_TRUE(parse_host_port("[fe80::1]:80", host, port, error));
  EXPECT_EQ(host, "fe80::1");
  struct bad {
    const char* text;
    const char* says;
  };
  for (auto [text, says] : {bad{"", "empty"}, bad{"localhost", "no ':PORT'"},
                            bad{"localhost:", "no port"}, bad{":7400", "no host"},
                            bad{"h:65536", "out of range"}, bad{"h:1234567", "out of range"},
                            bad{"h:-1", "not a number"}, bad{"h:80x", "not a number"},
                            bad{"::1:80", "brackets"}, bad{"[::1:80", "not closed"},
                            bad{"[::1]80", "no ':PORT'"}, bad{"a b:80", "contains"}}) {
    error.clear();
    EXPECT_FALSE(parse_host_port(text, host, port, error)) << text;
    EXPECT_NE(error.find(says), std::string::npos) << text << " -> " << error;
  }
}

// Each bad field is named with its line.
TEST(ClusterConfig, BadFieldsNameLineAndField) {
  struct bad {
    std::string text;
    std::string where;  // "c.yaml:LINE:" and "FIELD:"
    std::string says;
  };
  std::vector<bad> cases{
    {"listen: 127.0.0.1:7400\nlisen: 1.2.3.4:5\n", "c.yaml:2:1: lisen:", "did you mean 'listen'"},
    {"# x\nlisten: 127.0.0.1:99999\n", "c.yaml:2:9: listen:", "out of range"},
    {"\n\nshell_listen: 7401\n", "c.yaml:3:15: shell_listen:", "no ':PORT'"},
    {"join: 127.0.0.1:0\n", "c.yaml:1:7: join:", "port 0"},
    {"devices: four\n", "c.yaml:1:10: devices:", "expected an integer"},
    {"devices: 0\n", "c.yaml:1:10: devices:", "from 1 to 4096"},
    {"workers: -1\n", "c.yaml:1:10: workers:", "from 0 to 1024"},
    {"backend: tpu\n", "c.yaml:1:10: backend:", "model or jax-tpu"},
    {"chip: v6\n", "c.yaml:1:7: chip:", "unknown chip"},
    {"heartbeat_interval_ms: 1.5\n", "c.yaml:1:24: heartbeat_interval_ms:", "integer"},
    {"heartbeat_interval_ms: 500\nconnection_timeout_ms: 500\n",
     "c.yaml:2:24: connection_timeout_ms:", "must exceed"},
    {"token_file: [a, b]\n", "c.yaml:1:13: token_file:", "list"},
    {"- listen\n", "c.yaml:1:1: (document):", "mapping"},
    {"listen: [\n", "c.yaml:", "YAML"},
  };
  for (const auto& b : cases) {
    std::string e = parse_bad(b.text);
    EXPECT_NE(e.find(b.where), std::string::npos) << b.text << " -> " << e;
    EXPECT_NE(e.find(b.says), std::string::npos) << b.text << " -> " << e;
  }
}

TEST(ClusterConfig, MissingFileSaysSo) {
  std::string error;
  EXPECT_FALSE(load_cluster_config("/nonexistent/cluster.yaml", error).has_value());
  EXPECT_NE(error.find("/nonexistent/cluster.yaml"), std::string::npos) << error;
}

}  // namespace
}  // namespace maxkernel::config::test
