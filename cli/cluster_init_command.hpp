// `maxkernel cluster init DIR`: writes a new cluster's credentials into DIR (DIR/token and the
// TLS files beside it; docs/cluster.md, "Credentials"). Every process of the cluster then
// takes `--token-file DIR/token`.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace maxkernel::cli {

struct cluster_init_options {
  std::string dir;
};

// 0: written; 2: DIR already holds credentials or cannot be written; 3: OpenSSL failed or
// the files written do not read back.
int run_cluster_init(const cluster_init_options& opts);

// Adds the `cluster` command group with its `init DIR` command to `app`. main() keeps the
// object alive across app.parse and asks it afterwards:
//   maxkernel::cli::cluster_init_command cluster_init(app);       // with the other commands
//   if (cluster_init.selected()) return cluster_init.run();       // in the dispatch
class cluster_init_command {
public:
  explicit cluster_init_command(CLI::App& app);
  cluster_init_command(const cluster_init_command&) = delete;
  cluster_init_command& operator=(const cluster_init_command&) = delete;

  bool selected() const;  // `cluster init` was on the command line
  int run() const;

private:
  CLI::App* init_ = nullptr;
  cluster_init_options options_;
};

}  // namespace maxkernel::cli
