// The evaluation key of a request: the content address under which its result is stored.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "search/evaluation_key.hpp"

#include <string>
#include <string_view>

namespace maxkernel::tpu_nodes {

// Hex sha256 of the spec's canonical Cap'n Proto bytes, without the paths it was read from
// (sourcePath, baselinePath): the same task read from another directory has the same hash.
std::string spec_hash(schema::KernelSpec::Reader spec);

// The options that change a result, as text: seeds, full and configuration for a candidate
// (a reference is not tested: configuration only), the tester's valueMode (with valueScale)
// and shapeMode when set, plus the timing runs on jax-tpu.
std::string result_options(schema::EvalRequest::Reader request, std::string_view backend);

// search::evaluation_key over the candidate source (or the reference flag), the spec hash,
// chip, backend, JAX version, result_options and this process's evaluator_revision.
std::string request_key(schema::EvalRequest::Reader request, std::string_view chip,
                        std::string_view backend, std::string_view jax_version);

}  // namespace maxkernel::tpu_nodes
