// `--brains FILE`: the brain config of the roles (docs/brains.md), or every role expert.
#pragma once

#include "config/brain_config.hpp"

#include <string>

namespace maxkernel::cli {

// Reads `path` into `out` ("" = the default: every role expert); false with `error` naming
// the file, line and field (exit code 2).
bool load_brains(const std::string& path, config::brain_config& out, std::string& error);

}  // namespace maxkernel::cli
