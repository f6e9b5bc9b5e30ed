// A path inside a task's directory, as a peer names it (a submission's files, the outputs a
// supervisor sends back): both ends refuse anything that could land outside the directory.
#pragma once

#include <string>

namespace maxkernel::cli {

// Relative, no "." / ".." / empty parts, no NUL.
bool inside_task(const std::string& path);

}  // namespace maxkernel::cli
