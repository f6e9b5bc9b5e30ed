#include "search/kernel_fingerprint.hpp"

#include "messages/content_hash.hpp"

#include <capnp/message.h>

namespace maxkernel::search {

std::string kernel_fingerprint(schema::KernelStructure::Reader structure) {
  // Canonical: equal structures give equal bytes however their messages were laid out.
  auto words = capnp::canonicalize(structure);
  auto bytes = words.asBytes();
  return messages::sha256_hex(
    std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
}

}  // namespace maxkernel::search
