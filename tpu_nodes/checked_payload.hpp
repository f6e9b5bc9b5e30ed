// Opening payloads on a hot path. messages::open_payload validates by walking the message
// through capnp's dynamic API, which costs more than everything else a store hit does;
// capnp's own pointer traversal (totalSize) bounds-checks every pointer at a fraction of
// that. Fields read later can still throw kj::Exception (a Text without its NUL, a pointer
// of the wrong kind): callers catch it and answer malformed_message.
#pragma once

#include "maxkernel/schema/common.capnp.h"
#include "messages/payload_codec.hpp"

#include <kj/exception.h>

#include <optional>
#include <string>

namespace maxkernel::tpu_nodes {

template <class T>
std::optional<messages::decoded_message> open_checked(const std::string& bytes,
                                                      std::string& error) {
  auto msg = messages::decoded_message::parse(bytes, error);
  if (!msg)
    return std::nullopt;
  try {
    auto root = msg->template root<T>();
    (void)root.totalSize();
    if (!messages::schema_version_ok(root.getSchemaVersion(), error))
      return std::nullopt;
  } catch (const kj::Exception& e) {
    error = std::string("malformed message: ") + e.getDescription().cStr();
    return std::nullopt;
  }
  return msg;
}

template <class T>
std::optional<messages::decoded_message> open_checked(const messages::payload& p,
                                                      std::string& error) {
  if (p.type_id != capnp::typeId<T>()) {
    error = "payload holds another message type than expected";
    return std::nullopt;
  }
  if (p.own)  // built in this process (an embedded search's lineage): nothing to check
    return messages::open_own<T>(p, error);
  return open_checked<T>(p.bytes, error);
}

}  // namespace maxkernel::tpu_nodes
