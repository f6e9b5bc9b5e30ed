// The content address of an evaluation: equal parts, equal key, equal result.
#pragma once

#include "messages/content_hash.hpp"

#include <string>
#include <string_view>

namespace maxkernel::search {

// What identifies an evaluation. Two requests with equal parts get the same result.
struct evaluation_key_parts {
  std::string_view source;         // kernel source (normalised before hashing); "" for a reference
  std::string_view spec_hash;      // content hash of the KernelSpec (canonical capnp bytes)
  std::string_view chip;
  std::string_view backend;        // model | jax-tpu
  std::string_view jax_version;
  std::string_view options;        // anything else that changes the result (seeds, full, ...)
  std::string_view evaluator;      // the code and data that judge and price it (a digest:
                                   // tpu_nodes::evaluator_revision); "" leaves it out
  bool reference = false;          // the spec's reference rather than a candidate
};

// Line endings to \n, trailing whitespace of each line and trailing blank lines removed:
// edits that cannot change what Python runs.
std::string normalize_source(std::string_view source);
// Hex sha256 over the parts, each length-prefixed.
std::string evaluation_key(const evaluation_key_parts& parts);

// The key's hash over its leading parts (its format, reference or candidate, the normalised
// source): one per kernel, shared by all of that kernel's requests.
messages::sha256_stream evaluation_key_prefix(bool reference, std::string_view normalized);
// The key from that prefix and the rest of `parts` (its source and reference are not read).
std::string evaluation_key(const messages::sha256_stream& prefix,
                           const evaluation_key_parts& parts);

}  // namespace maxkernel::search
