// Content addresses: hex SHA-256 of a byte string (candidate ids, store keys).
#pragma once

#include <string>
#include <string_view>

namespace maxkernel::messages {

std::string sha256_hex(std::string_view bytes);

}  // namespace maxkernel::messages
