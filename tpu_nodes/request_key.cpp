#include "tpu_nodes/request_key.hpp"

#include "messages/content_hash.hpp"

#include <capnp/message.h>

#include <cstdio>
#include <deque>
#include <mutex>
#include <unordered_map>

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
    if (options.getProfileOnly())
      out += ";profileOnly=1";
    // The tester's modes (agents/tester): appended only when set, so the keys of requests
    // without them are the ones stored before the modes existed.
    auto value_mode = options.getValueMode();
    if (value_mode.size() > 0) {
      out += ";valueMode=";
      out += value_mode.cStr();
      char scale[32];
      std::snprintf(scale, sizeof scale, "%.17g", options.getValueScale());
      out += ";valueScale=";
      out += scale;
    }
    auto shape_mode = options.getShapeMode();
    if (shape_mode.size() > 0) {
      out += ";shapeMode=";
      out += shape_mode.cStr();
    }
  }
  if (backend == "jax-tpu") {
    out += ";timeRuns=" + std::to_string(options.getTimeRuns());
    out += ";warmupRuns=" + std::to_string(options.getWarmupRuns());
  }
  return out;
}

namespace {

// The normalised sources of the last few candidates, shared by every node of the process:
// a candidate's requests (its default evaluation and each tester case) go to different
// nodes, and normalising a source is the costly part of a key.
class normalized_sources {
public:
  std::string of(std::string_view source) {
    std::string key(source);
    {
      std::lock_guard lock(mutex_);
      auto it = memo_.find(key);
      if (it != memo_.end())
        return it->second;
    }
    auto normalized = search::normalize_source(source);
    std::lock_guard lock(mutex_);
    if (memo_.emplace(key, normalized).second) {
      order_.push_back(std::move(key));
      if (order_.size() > capacity) {
        memo_.erase(order_.front());
        order_.pop_front();
      }
    }
    return normalized;
  }

private:
  static constexpr size_t capacity = 64;
  std::mutex mutex_;
  std::unordered_map<std::string, std::string> memo_;
  std::deque<std::string> order_;  // oldest first
};

normalized_sources& shared_sources() {
  static normalized_sources sources;
  return sources;
}

std::string key_of(const search::evaluation_key_parts& parts) {
  return search::evaluation_key(parts, shared_sources().of(parts.source));
}

}  // namespace

std::string key_memo::key(const search::evaluation_key_parts& parts) {
  std::string raw;
  raw.reserve(parts.source.size() + parts.spec_hash.size() + parts.options.size() + 64);
  // Length-prefixed parts, so that no two different part lists share a memo entry.
  for (std::string_view part : {parts.source, parts.spec_hash, parts.chip, parts.backend,
                                parts.jax_version, parts.options}) {
    raw += std::to_string(part.size());
    raw += ':';
    raw += part;
  }
  raw += parts.reference ? 'r' : 'c';
  auto it = memo_.find(raw);
  if (it != memo_.end())
    return it->second;
  if (bytes_ + raw.size() > max_bytes_) {
    memo_.clear();
    bytes_ = 0;
  }
  bytes_ += raw.size() + 64;
  auto key = key_of(parts);
  memo_.emplace(std::move(raw), key);
  return key;
}

std::string request_key(schema::EvalRequest::Reader request, std::string_view chip,
                        std::string_view backend, std::string_view jax_version,
                        key_memo* memo) {
  bool reference = request.getReference();
  auto text = request.getCandidate().getSource();
  auto hash = spec_hash(request.getSpec());
  auto options = result_options(request, backend);
  search::evaluation_key_parts parts;
  // evaluation_key normalises the source itself.
  parts.source = reference ? std::string_view() : std::string_view(text.begin(), text.size());
  parts.spec_hash = hash;
  parts.chip = chip;
  parts.backend = backend;
  parts.jax_version = jax_version;
  parts.options = options;
  parts.reference = reference;
  return memo ? memo->key(parts) : key_of(parts);
}

}  // namespace maxkernel::tpu_nodes
