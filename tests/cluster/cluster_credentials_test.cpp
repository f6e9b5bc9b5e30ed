// `maxkernel cluster init DIR`'s files: modes, refusal to overwrite, reading them back, and
// the errors of a token that does not match the files.
#include "cluster/cluster_credentials.hpp"
#include "config/cluster_config.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace maxkernel::cluster::test {
namespace {

namespace fs = std::filesystem;

class temp_dir {
public:
  temp_dir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("mk_creds_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

private:
  fs::path path_;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

unsigned mode_of(const fs::path& p) {
  struct stat st{};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

TEST(ClusterCredentials, InitWritesTheFilesWithTheirModes) {
  temp_dir t;
  fs::path dir = t.path() / "cluster";  // created by init
  auto r = init_cluster_credentials(dir.string());
  ASSERT_EQ(r.status, init_status::written) << r.error;
  ASSERT_EQ(r.files.size(), 4u);
  EXPECT_EQ(fs::path(r.files.back()).filename(), "token");  // written last
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(mode_of(dir / "token"), 0600u);
  EXPECT_EQ(mode_of(dir / "cluster.key"), 0600u);
  EXPECT_EQ(mode_of(dir / "ca.pem"), 0644u);
  EXPECT_EQ(mode_of(dir / "cluster.pem"), 0644u);
  std::string token = slurp(dir / "token");
  ASSERT_EQ(token.size(), 65u);  // 64 hex digits and a newline
  EXPECT_NE(slurp(dir / "cluster.key").find("BEGIN ENCRYPTED PRIVATE KEY"), std::string::npos);
  // The token is the secret: it appears in no other file.
  std::string hex = token.substr(0, 64);
  for (const char* f : {"ca.pem", "cluster.pem", "cluster.key"})
    EXPECT_EQ(slurp(dir / f).find(hex), std::string::npos) << f;
}

TEST(ClusterCredentials, InitRefusesToOverwrite) {
  temp_dir t;
  ASSERT_EQ(init_cluster_credentials(t.path().string()).status, init_status::written);
  std::string token = slurp(t.path() / "token");
  std::string key = slurp(t.path() / "cluster.key");
  auto again = init_cluster_credentials(t.path().string());
  EXPECT_EQ(again.status, init_status::exists);
  EXPECT_NE(again.error.find("refusing to overwrite"), std::string::npos) << again.error;
  EXPECT_EQ(slurp(t.path() / "token"), token);
  EXPECT_EQ(slurp(t.path() / "cluster.key"), key);
  // A token alone (the rest lost) is refused too, and nothing is written beside it.
  temp_dir u;
  std::ofstream(u.path() / "token") << "x\n";
  EXPECT_EQ(init_cluster_credentials(u.path().string()).status, init_status::exists);
  EXPECT_FALSE(fs::exists(u.path() / "ca.pem"));
}

TEST(ClusterCredentials, InitFailsWhereItCannotWrite) {
  temp_dir t;
  std::ofstream(t.path() / "file") << "x";
  auto r = init_cluster_credentials((t.path() / "file" / "sub").string());
  EXPECT_EQ(r.status, init_status::unwritable);
  EXPECT_NE(r.error.find("cannot create the directory"), std::string::npos) << r.error;
  auto r2 = init_cluster_credentials((t.path() / "file").string());
  EXPECT_EQ(r2.status, init_status::unwritable);
  EXPECT_NE(r2.error.find("not a directory"), std::string::npos) << r2.error;
}

TEST(ClusterCredentials, ReadBack) {
  temp_dir t;
  ASSERT_EQ(init_cluster_credentials(t.path().string()).status, init_status::written);
  std::string error;
  auto c = read_cluster_credentials((t.path() / "token").string(), error);
  ASSERT_TRUE(c.has_value()) << error;
  EXPECT_EQ(c->ca_file, (t.path() / "ca.pem").string());
  EXPECT_EQ(c->certificate_file, (t.path() / "cluster.pem").string());
  EXPECT_EQ(c->key_file, (t.path() / "cluster.key").string());
  EXPECT_EQ(c->key_passphrase.size(), 64u);
  EXPECT_NE(c->key_passphrase + "\n", slurp(t.path() / "token"));  // derived, not the token
  for (const auto* k : {&c->curve_server_public, &c->curve_server_secret,
                        &c->curve_client_public, &c->curve_client_secret})
    EXPECT_EQ(k->size(), 40u);
  EXPECT_NE(c->curve_server_public, c->curve_client_public);
  EXPECT_NE(c->curve_server_secret, c->curve_client_secret);
  EXPECT_EQ(c->cluster_id.size(), 16u);
  EXPECT_TRUE(c->warnings.empty());
  // Reading again gives the same keys (they are derived, not drawn).
  auto again = read_cluster_credentials((t.path() / "token").string(), error);
  ASSERT_TRUE(again.has_value()) << error;
  EXPECT_EQ(again->curve_client_secret, c->curve_client_secret);
  // Another cluster has other keys.
  temp_dir u;
  ASSERT_EQ(init_cluster_credentials(u.path().string()).status, init_status::written);
  auto other = read_cluster_credentials((u.path() / "token").string(), error);
  ASSERT_TRUE(other.has_value()) << error;
  EXPECT_NE(other->curve_server_public, c->curve_server_public);
  EXPECT_NE(other->cluster_id, c->cluster_id);
}

TEST(ClusterCredentials, ReadErrors) {
  temp_dir t, u;
  ASSERT_EQ(init_cluster_credentials(t.path().string()).status, init_status::written);
  ASSERT_EQ(init_cluster_credentials(u.path().string()).status, init_status::written);
  std::string error;
  auto expect_error = [&](const fs::path& token, const std::string& says) {
    error.clear();
    EXPECT_FALSE(read_cluster_credentials(token.string(), error).has_value()) << token;
    EXPECT_NE(error.find(says), std::string::npos) << error;
  };
  expect_error(t.path() / "missing", "does not exist");
  // Another cluster's token beside these files: the key does not open.
  fs::copy_file(u.path() / "token", t.path() / "other_token");
  expect_error(t.path() / "other_token", "does not open with the token");
  EXPECT_EQ(error.rfind("authentication failed", 0), 0u) << error;
  // Not a token at all.
  std::ofstream(t.path() / "junk") << "-----BEGIN CERTIFICATE-----\n";
  expect_error(t.path() / "junk", "is not a maxkernel cluster token");
  // A file missing beside the token.
  fs::remove(u.path() / "ca.pem");
  expect_error(u.path() / "token", "ca.pem");
  // The certificate of another cluster beside the right key.
  temp_dir v;
  ASSERT_EQ(init_cluster_credentials(v.path().string()).status, init_status::written);
  fs::copy_file(t.path() / "cluster.pem", v.path() / "cluster.pem",
                fs::copy_options::overwrite_existing);
  expect_error(v.path() / "token", "does not belong to the key");
}

TEST(ClusterCredentials, ATokenOthersCanReadIsAcceptedWithAWarning) {
  temp_dir t;
  ASSERT_EQ(init_cluster_credentials(t.path().string()).status, init_status::written);
  fs::permissions(t.path() / "token", fs::perms(0644), fs::perm_options::replace);
  std::string error;
  auto c = read_cluster_credentials((t.path() / "token").string(), error);
  ASSERT_TRUE(c.has_value()) << error;
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("chmod 600"), std::string::npos) << c->warnings[0];
}

// config/cluster.example.yaml as shipped, beside the directory its comment tells to init:
// its token_file names the token init wrote, wherever the process runs from.
TEST(ClusterCredentials, TheExampleConfigFindsTheTokenInitWrote) {
  temp_dir t;
  fs::copy_file(fs::path(MAXKERNEL_SOURCE_DIR) / "config" / "cluster.example.yaml",
                t.path() / "cluster.yaml");
  ASSERT_EQ(init_cluster_credentials((t.path() / "cluster").string()).status,
            init_status::written);
  std::string error;
  auto config = config::load_cluster_config((t.path() / "cluster.yaml").string(), error);
  ASSERT_TRUE(config.has_value()) << error;
  auto c = read_cluster_credentials(config->token_file, error);
  ASSERT_TRUE(c.has_value()) << error;
  EXPECT_EQ(fs::path(c->directory), t.path() / "cluster");
}

}  // namespace
}  // namespace maxkernel::cluster::test
