// Reading a kernel file given on the command line: a regular UTF-8 file of at most 1 MiB.
#pragma once

#include <string>

namespace maxkernel::cli {

bool read_kernel(const std::string& path, std::string& source, std::string& error);

}  // namespace maxkernel::cli
