// Content addresses: hex SHA-256 of a byte string (candidate ids, store keys).
#pragma once

#include <string>
#include <string_view>

typedef struct evp_md_ctx_st EVP_MD_CTX;

namespace maxkernel::messages {

std::string sha256_hex(std::string_view bytes);

// Appends `part` as "<decimal length>:<bytes>": parts framed this way and hashed together
// cannot trade bytes across a boundary (("ab","c") and ("a","bc") differ).
void append_part(std::string& out, std::string_view part);

// SHA-256 fed in parts. A copy carries the state so far: a long common prefix (a kernel's
// source, the same for each of its requests) is hashed once and each copy finishes with
// its own tail.
class sha256_stream {
public:
  sha256_stream();
  sha256_stream(const sha256_stream& other);
  sha256_stream& operator=(const sha256_stream& other);
  ~sha256_stream();

  void update(std::string_view bytes);
  // The hex digest of everything fed so far; the stream itself goes on unchanged.
  std::string hex() const;

private:
  EVP_MD_CTX* ctx_;
};

}  // namespace maxkernel::messages
