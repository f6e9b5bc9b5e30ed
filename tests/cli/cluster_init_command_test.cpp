// `maxkernel cluster init DIR` wired as main() wires it: parse, run, exit codes.
#include "cli/cluster_init_command.hpp"

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

namespace maxkernel::cli::test {
namespace {

namespace fs = std::filesystem;

// Parses argv as main() does (with a sibling command) and runs `cluster init` when selected;
// -1 when another command was selected.
int run_main(std::vector<std::string> args) {
  CLI::App app{"maxkernel"};
  app.require_subcommand(1);
  app.add_subcommand("other", "another command");
  cluster_init_command cluster_init(app);
  std::vector<const char*> argv{"maxkernel"};
  for (const auto& a : args)
    argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (cluster_init.selected())
    return cluster_init.run();
  return -1;
}

struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("mk_init_" + std::to_string(std::random_device{}()));
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST(ClusterInitCommand, WritesOnceThenRefuses) {
  temp_dir t;
  std::string dir = (t.path / "creds").string();
  EXPECT_EQ(run_main({"cluster", "init", dir}), 0);
  EXPECT_TRUE(fs::exists(t.path / "creds" / "token"));
  EXPECT_TRUE(fs::exists(t.path / "creds" / "cluster.key"));
  std::ifstream in(t.path / "creds" / "token");
  std::string token;
  std::getline(in, token);
  EXPECT_EQ(run_main({"cluster", "init", dir}), 2);
  std::ifstream again(t.path / "creds" / "token");
  std::string token2;
  std::getline(again, token2);
  EXPECT_EQ(token, token2);
}

TEST(ClusterInitCommand, UnwritableAndUsageErrorsAreBadInput) {
  temp_dir t;
  fs::create_directories(t.path);
  std::ofstream(t.path / "file") << "x";
  EXPECT_EQ(run_main({"cluster", "init", (t.path / "file" / "sub").string()}), 2);
  EXPECT_EQ(run_main({"cluster", "init"}), 2);  // DIR missing
  EXPECT_EQ(run_main({"cluster"}), 2);          // no cluster command
  EXPECT_EQ(run_main({"other"}), -1);           // not selected
}

}  // namespace
}  // namespace maxkernel::cli::test
