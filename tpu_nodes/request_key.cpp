#include "tpu_nodes/request_key.hpp"

#include "messages/content_hash.hpp"

#include <capnp/message.h>

#include <cstdio>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace maxkernel::tpu_nodes {

std::string spec_hash(schema::KernelSpec::Reader spec) {
  // Where the spec was read is not what it says: a cluster submission's copy of a task lives
  // in a directory of its own (STATE/submissions/ID/task), and a resubmitted task must find
  // its stored results. The reference, configurations, tolerances and shipped task files
  // (relative paths, content) stay in.
  capnp::MallocMessageBuilder copy;
  copy.setRoot(spec);
  auto located = copy.getRoot<schema::KernelSpec>();
  located.setSourcePath("");
  located.setBaselinePath("");
  auto words = capnp::canonicalize(located.asReader());
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
  // Appended only when set, like the tester's modes: the unscoped keys are the ones stored
  // before scopes existed. The reference's time is scoped too (a mode's run pays for it).
  auto scope = options.getStoreScope();
  if (scope.size() > 0) {
    out += ";storeScope=";
    out += scope.cStr();
  }
  if (backend == "jax-tpu") {
    out += ";timeRuns=" + std::to_string(options.getTimeRuns());
    out += ";warmupRuns=" + std::to_string(options.getWarmupRuns());
  }
  return out;
}

namespace {

struct text_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

// The key prefixes (search::evaluation_key_prefix: the normalised source hashed) of the last
// few candidates, shared by every node of the process: a candidate's requests (its default
// evaluation and each tester case) go to different nodes, and normalising and hashing a
// source is the costly part of a key; what is left per request is a short tail.
class source_prefixes {
public:
  messages::sha256_stream of(std::string_view source) {
    {
      std::lock_guard lock(mutex_);
      auto it = memo_.find(source);
      if (it != memo_.end())
        return it->second;
    }
    auto prefix = search::evaluation_key_prefix(false, search::normalize_source(source));
    std::lock_guard lock(mutex_);
    auto [it, added] = memo_.emplace(std::string(source), prefix);
    if (added) {
      order_.push_back(it->first);
      if (order_.size() > capacity) {
        memo_.erase(order_.front());
        order_.pop_front();
      }
    }
    return prefix;
  }

private:
  static constexpr size_t capacity = 64;
  std::mutex mutex_;
  std::unordered_map<std::string, messages::sha256_stream, text_hash, std::equal_to<>> memo_;
  std::deque<std::string> order_;  // oldest first
};

source_prefixes& shared_prefixes() {
  static source_prefixes prefixes;
  return prefixes;
}

const messages::sha256_stream& reference_prefix() {
  static const auto prefix = search::evaluation_key_prefix(true, "");
  return prefix;
}

}  // namespace

std::string request_key(schema::EvalRequest::Reader request, std::string_view chip,
                        std::string_view backend, std::string_view jax_version,
                        std::string_view evaluator) {
  bool reference = request.getReference();
  auto hash = spec_hash(request.getSpec());
  auto options = result_options(request, backend);
  search::evaluation_key_parts parts;
  parts.spec_hash = hash;
  parts.chip = chip;
  parts.backend = backend;
  parts.jax_version = jax_version;
  parts.options = options;
  parts.evaluator = evaluator;
  parts.reference = reference;
  if (reference)
    return search::evaluation_key(reference_prefix(), parts);
  auto text = request.getCandidate().getSource();
  return search::evaluation_key(shared_prefixes().of(std::string_view(text.begin(), text.size())),
                                parts);
}

}  // namespace maxkernel::tpu_nodes
