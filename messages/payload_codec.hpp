// Building and reading payloads of a given schema type.
#pragma once

#include "messages/capnp_io.hpp"
#include "messages/payload.hpp"

#include <capnp/schema.h>

namespace maxkernel::messages {

template <class T>
payload make_payload(capnp::MessageBuilder& message) {
  return payload{capnp::typeId<T>(), encode(message)};
}

template <class T, class Reader>
payload make_payload_from(Reader reader) {
  return payload{capnp::typeId<T>(), encode_root(reader)};
}

// Decodes a payload that must hold a T; a payload of another type is refused.
template <class T>
std::optional<decoded_message> open_payload(const payload& p, std::string& error) {
  if (p.type_id != capnp::typeId<T>()) {
    error = "payload holds another message type than expected";
    return std::nullopt;
  }
  return decode<T>(p.bytes, error);
}

}  // namespace maxkernel::messages
