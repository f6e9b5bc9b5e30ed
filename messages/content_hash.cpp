#include "messages/content_hash.hpp"

#include <openssl/evp.h>

#include <array>
#include <cstdio>

namespace maxkernel::messages {

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest.data(), &len, EVP_sha256(), nullptr);
  std::string out;
  out.reserve(len * 2);
  char buf[3];
  for (unsigned i = 0; i < len; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", digest[i]);
    out += buf;
  }
  return out;
}

}  // namespace maxkernel::messages
