// Building and reading payloads of a given schema type.
#pragma once

#include "maxkernel/schema/common.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/payload.hpp"

#include <capnp/schema.h>

#include <type_traits>

namespace maxkernel::messages {

template <class T>
payload make_payload(capnp::MessageBuilder& message) {
  return payload{capnp::typeId<T>(), encode(message), true};
}

template <class T, class Reader>
payload make_payload_from(Reader reader) {
  return payload{capnp::typeId<T>(), encode_root(reader), true};
}

namespace detail {
template <class Reader, class = void>
struct has_schema_version : std::false_type {};
template <class Reader>
struct has_schema_version<Reader,
                          std::void_t<decltype(std::declval<Reader&>().getSchemaVersion())>>
  : std::true_type {};
}  // namespace detail

// A payload this process built (payload::own): read without decode's walk, which would only
// read well-formed bytes again. The schema version is still checked, as decode does: a
// builder that forgot to set it must fail here as it would after crossing a host.
template <class T>
std::optional<decoded_message> open_own(const payload& p, std::string& error) {
  auto msg = decoded_message::from_own(p.bytes);
  if constexpr (detail::has_schema_version<typename T::Reader>::value) {
    if (!schema_version_ok(msg.template root<T>().getSchemaVersion(), error))
      return std::nullopt;
  }
  return msg;
}

// Decodes a payload that must hold a T; a payload of another type is refused.
template <class T>
std::optional<decoded_message> open_payload(const payload& p, std::string& error) {
  if (p.type_id != capnp::typeId<T>()) {
    error = "payload holds another message type than expected";
    return std::nullopt;
  }
  if (p.own)
    return open_own<T>(p, error);
  return decode<T>(p.bytes, error);
}

}  // namespace maxkernel::messages
