// The one CAF message type that carries Cap'n Proto payloads between actors (in-process and
// across hosts): the schema's type id names what the bytes hold.
#pragma once

#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>

namespace maxkernel::messages {

struct payload {
  uint64_t type_id = 0;  // capnp::typeId<T>() of the root struct
  std::string bytes;     // messages::encode() output
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, payload& x) {
  return f(caf::meta::type_name("maxkernel_payload"), x.type_id, x.bytes);
}

inline bool operator==(const payload& a, const payload& b) {
  return a.type_id == b.type_id && a.bytes == b.bytes;
}

}  // namespace maxkernel::messages
