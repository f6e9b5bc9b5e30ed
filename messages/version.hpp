#pragma once

#include <string>

namespace maxkernel::messages {

std::string maxkernel_version();
// Directory holding the *.capnp schemas (the Python worker loads them at run time).
std::string schema_dir();

}  // namespace maxkernel::messages
