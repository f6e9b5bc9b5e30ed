// Every Cap'n Proto root type that arrives from another process, received as its receivers
// receive it (tests/fuzz/inbound_types). Input: one byte naming the type, then the bytes.
#include "inbound_types.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const auto& types = maxkernel::fuzz::inbound_types();
  const auto& type = types[data[0] % types.size()];
  type.receive(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  return 0;
}
