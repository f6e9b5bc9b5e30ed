#include "cli/cluster_init_command.hpp"

#include "cluster/cluster_credentials.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

namespace maxkernel::cli {

int run_cluster_init(const cluster_init_options& opts) {
  using cluster::init_status;
  auto r = cluster::init_cluster_credentials(opts.dir);
  switch (r.status) {
    case init_status::written: break;
    case init_status::exists:
    case init_status::unwritable:
      std::cerr << "cluster init: " << r.error << "\n";
      return 2;
    case init_status::failed:
      std::cerr << "cluster init: " << r.error << "\n";
      return 3;
  }
  // Read back what was written, as every process will.
  std::string token = r.files.back();
  std::string error;
  auto creds = cluster::read_cluster_credentials(token, error);
  if (!creds) {
    std::cerr << "cluster init: the files written do not read back: " << error << "\n";
    return 3;
  }
  std::cout << fmt::format(
    "cluster {}: credentials written to {}/\n"
    "  {:<12} the cluster CA's certificate (its private key is not kept)\n"
    "  {:<12} the certificate every process of the cluster presents\n"
    "  {:<12} its private key, encrypted under the token (0600)\n"
    "  {:<12} the secret (0600): every process takes --token-file {}\n"
    "Copy the whole directory to every host of the cluster (scp -rp keeps the modes); anyone "
    "who holds the token can join the cluster.\n",
    creds->cluster_id, creds->directory, cluster::ca_file_name, cluster::certificate_file_name,
    cluster::key_file_name, cluster::token_file_name, creds->token_file);
  return 0;
}

cluster_init_command::cluster_init_command(CLI::App& app) {
  auto* group = app.add_subcommand("cluster", "a cluster's credentials (docs/cluster.md)");
  group->require_subcommand(1);
  init_ = group->add_subcommand(
    "init", "write a new cluster's credentials into DIR: DIR/token (the secret every process "
            "takes with --token-file) and the TLS files beside it");
  init_->add_option("DIR", options_.dir, "directory to write (created when missing)")
    ->required();
}

bool cluster_init_command::selected() const { return init_ && init_->parsed(); }

int cluster_init_command::run() const { return run_cluster_init(options_); }

}  // namespace maxkernel::cli
