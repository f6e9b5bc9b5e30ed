// The one CAF message type that carries Cap'n Proto payloads between actors (in-process and
// across hosts): the schema's type id names what the bytes hold.
#pragma once

#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace maxkernel::messages {

struct payload {
  uint64_t type_id = 0;  // capnp::typeId<T>() of the root struct
  std::string bytes;     // messages::encode() output
  // Set by make_payload only: this process built the bytes, so opening them here needs no
  // check (decoded_message::from_own). Never serialized: a payload that arrives from a peer,
  // a socket or a file is not own, whatever the sender had.
  bool own = false;
};

namespace detail {
template <class Inspector, class = void>
struct writes_state : std::false_type {};
template <class Inspector>
struct writes_state<Inspector, std::void_t<decltype(Inspector::writes_state)>>
  : std::bool_constant<Inspector::writes_state> {};
}  // namespace detail

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, payload& x) {
  if constexpr (detail::writes_state<Inspector>::value)
    x.own = false;  // deserialized: from another process
  return f(caf::meta::type_name("maxkernel_payload"), x.type_id, x.bytes);
}

inline bool operator==(const payload& a, const payload& b) {
  return a.type_id == b.type_id && a.bytes == b.bytes;
}

}  // namespace maxkernel::messages
