// Reading a cluster's credentials for a command (--token-file): what every cluster process
// and client does first, with the same messages and exit codes.
#pragma once

#include "cluster/cluster_credentials.hpp"

#include <iosfwd>
#include <optional>
#include <string>

namespace maxkernel::cli {

// The credentials, their warnings written to `err`; or nullopt with the reason written and
// `exit_code` 2 (a missing or malformed file) or 3 (a token that does not open the cluster's
// key: "authentication failed"). `given_by` names where the path came from in the message
// ("--token-file", or a config file's "FILE:LINE:COLUMN: token_file").
std::optional<cluster::cluster_credentials> load_token_file(
  const std::string& path, std::ostream& err, int& exit_code,
  const std::string& given_by = "--token-file");

}  // namespace maxkernel::cli
