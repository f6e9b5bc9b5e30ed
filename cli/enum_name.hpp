// A Cap'n Proto enum value's name as the schema spells it (for reports and JSON).
#pragma once

#include <capnp/schema.h>

#include <cstdint>
#include <string>

namespace maxkernel::cli {

template <class Enum>
std::string enum_name(Enum value) {
  auto schema = capnp::Schema::from<Enum>();
  for (auto e : schema.getEnumerants())
    if (e.getOrdinal() == static_cast<uint16_t>(value))
      return e.getProto().getName().cStr();
  return std::to_string(static_cast<int>(value));
}

}  // namespace maxkernel::cli
