// The evaluation key of a request: the content address under which its result is stored.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "search/evaluation_key.hpp"

#include <string>
#include <string_view>
#include <unordered_map>

namespace maxkernel::tpu_nodes {

// Hex sha256 of the spec's canonical Cap'n Proto bytes.
std::string spec_hash(schema::KernelSpec::Reader spec);

// The options that change a result, as text: seeds, full and configuration for a candidate
// (a reference is not tested: configuration only), the tester's valueMode (with valueScale)
// and shapeMode when set, plus the timing runs on jax-tpu.
std::string result_options(schema::EvalRequest::Reader request, std::string_view backend);

// Remembers the keys of requests seen recently. A search resubmits the same sources, and
// search::evaluation_key normalises the source every time, the costliest part of a key;
// the memo is looked up by the raw parts. Bounded by the bytes it holds.
class key_memo {
public:
  explicit key_memo(size_t max_bytes = 16u << 20) : max_bytes_(max_bytes) {}
  std::string key(const search::evaluation_key_parts& parts);

private:
  std::unordered_map<std::string, std::string> memo_;
  size_t bytes_ = 0;
  size_t max_bytes_;
};

// search::evaluation_key over the candidate source (or the reference flag), the spec hash,
// chip, backend, JAX version and result_options. `memo` may be null.
std::string request_key(schema::EvalRequest::Reader request, std::string_view chip,
                        std::string_view backend, std::string_view jax_version,
                        key_memo* memo = nullptr);

}  // namespace maxkernel::tpu_nodes
