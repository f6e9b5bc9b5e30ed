// The Cap'n Proto root types that arrive from another process (cluster peers over CAF, the
// operator gateway and the client port over ZeroMQ, the JAX worker), each received the way
// its receivers receive it: the same decode, the same checks, the same first reads.
#pragma once

#include <capnp/schema.h>

#include <cstdint>
#include <string>
#include <vector>

namespace maxkernel::fuzz {

struct inbound_type {
  const char* name;
  uint64_t id;  // capnp::typeId of the root
  capnp::StructSchema schema;
  void (*receive)(const std::string& bytes);
};

const std::vector<inbound_type>& inbound_types();

// The receivers of a payload of `type_id` (a CAF maxkernel_payload); an unknown id is refused
// as open_payload refuses it.
void receive_payload(uint64_t type_id, const std::string& bytes);

}  // namespace maxkernel::fuzz
