#include "messages/version.hpp"

namespace maxkernel::messages {

std::string maxkernel_version() {
  return MAXKERNEL_VERSION;
}

std::string schema_dir() {
  return MAXKERNEL_SCHEMA_DIR;
}

}  // namespace maxkernel::messages
