#include "cli/token_file.hpp"

#include <ostream>

namespace maxkernel::cli {

std::optional<cluster::cluster_credentials> load_token_file(const std::string& path,
                                                            std::ostream& err, int& exit_code,
                                                            const std::string& given_by) {
  std::string error;
  auto creds = cluster::read_cluster_credentials(path, error);
  if (!creds) {
    err << "error: " << given_by << ": " << error << "\n";
    exit_code = error.rfind("authentication failed", 0) == 0 ? 3 : 2;
    return std::nullopt;
  }
  for (auto& w : creds->warnings)
    err << "warning: " << w << "\n";
  exit_code = 0;
  return creds;
}

}  // namespace maxkernel::cli
