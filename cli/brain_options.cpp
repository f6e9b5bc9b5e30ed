#include "cli/brain_options.hpp"

namespace maxkernel::cli {

bool load_brains(const std::string& path, config::brain_config& out, std::string& error) {
  out = config::default_brain_config();
  if (path.empty())
    return true;
  config::spec_error e;
  if (!config::load_brain_config(path, out, e)) {
    error = e.what();
    return false;
  }
  return true;
}

}  // namespace maxkernel::cli
