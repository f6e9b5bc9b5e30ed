#include "search/kernel_fingerprint.hpp"

#include "messages/content_hash.hpp"

#include <capnp/message.h>

namespace maxkernel::search {

std::string kernel_fingerprint(schema::KernelStructure::Reader structure) {
  // The VMEM limit decides whether a kernel compiles, not what it runs (the playbook's
  // params_key leaves it out too): two limits over the same blocks are one kernel.
  capnp::MallocMessageBuilder copy;
  copy.setRoot(structure);
  for (auto call : copy.getRoot<schema::KernelStructure>().getPallasCalls())
    call.setVmemLimitBytes(0);
  // Canonical: equal structures give equal bytes however their messages were laid out.
  auto words = capnp::canonicalize(copy.getRoot<schema::KernelStructure>().asReader());
  auto bytes = words.asBytes();
  return messages::sha256_hex(
    std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
}

}  // namespace maxkernel::search
