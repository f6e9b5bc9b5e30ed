#include "tpu_nodes/request_key.hpp"

#include "messages/content_hash.hpp"
#include "search/evaluation_key.hpp"

#include <capnp/message.h>

namespace maxkernel::tpu_nodes {

std::string spec_hash(schema::KernelSpec::Reader spec) {
  auto words = capnp::canonicalize(spec);
  auto bytes = words.asBytes();
  return messages::sha256_hex(
    std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
}

std::string result_options(schema::EvalRequest::Reader request, std::string_view backend) {
  auto options = request.getOptions();
  std::string out = "configuration=" + std::to_string(options.getConfiguration());
  if (!request.getReference()) {
    out += ";seeds=";
    bool first = true;
    for (auto seed : options.getSeeds()) {
      if (!first)
        out += ',';
      out += std::to_string(seed);
      first = false;
    }
    out += options.getFull() ? ";full=1" : ";full=0";
  }
  if (backend == "jax-tpu") {
    out += ";timeRuns=" + std::to_string(options.getTimeRuns());
    out += ";warmupRuns=" + std::to_string(options.getWarmupRuns());
  }
  return out;
}

std::string request_key(schema::EvalRequest::Reader request, std::string_view chip,
                        std::string_view backend, std::string_view jax_version) {
  bool reference = request.getReference();
  std::string source =
    reference ? std::string() : search::normalize_source(request.getCandidate().getSource().cStr());
  auto hash = spec_hash(request.getSpec());
  auto options = result_options(request, backend);
  search::evaluation_key_parts parts;
  parts.source = source;
  parts.spec_hash = hash;
  parts.chip = chip;
  parts.backend = backend;
  parts.jax_version = jax_version;
  parts.options = options;
  parts.reference = reference;
  return search::evaluation_key(parts);
}

}  // namespace maxkernel::tpu_nodes
