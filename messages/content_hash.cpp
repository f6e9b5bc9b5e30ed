#include "messages/content_hash.hpp"

#include <openssl/evp.h>

#include <array>
#include <new>

namespace maxkernel::messages {

namespace {

std::string to_hex(const unsigned char* digest, unsigned len) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(len * 2, '0');
  for (unsigned i = 0; i < len; ++i) {
    out[2 * i] = digits[digest[i] >> 4];
    out[2 * i + 1] = digits[digest[i] & 0xf];
  }
  return out;
}

EVP_MD_CTX* new_context() {
  auto* ctx = EVP_MD_CTX_new();
  if (!ctx)
    throw std::bad_alloc();
  return ctx;
}

}  // namespace

void append_part(std::string& out, std::string_view part) {
  out += std::to_string(part.size());
  out += ':';
  out += part;
}

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest.data(), &len, EVP_sha256(), nullptr);
  return to_hex(digest.data(), len);
}

sha256_stream::sha256_stream() : ctx_(new_context()) {
  EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
}

sha256_stream::sha256_stream(const sha256_stream& other) : ctx_(new_context()) {
  EVP_MD_CTX_copy_ex(ctx_, other.ctx_);
}

sha256_stream& sha256_stream::operator=(const sha256_stream& other) {
  if (this != &other)
    EVP_MD_CTX_copy_ex(ctx_, other.ctx_);
  return *this;
}

sha256_stream::~sha256_stream() { EVP_MD_CTX_free(ctx_); }

void sha256_stream::update(std::string_view bytes) {
  EVP_DigestUpdate(ctx_, bytes.data(), bytes.size());
}

std::string sha256_stream::hex() const {
  sha256_stream last(*this);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(last.ctx_, digest.data(), &len);
  return to_hex(digest.data(), len);
}

}  // namespace maxkernel::messages
