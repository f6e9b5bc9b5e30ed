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
// chip, backend, JAX version, result_options and the evaluator revision (a node passes
// evaluator_revision(backend, chip); kept a parameter so that the key stays a pure function
// of its arguments, built without the chip files and worker package it digests).
std::string request_key(schema::EvalRequest::Reader request, std::string_view chip,
                        std::string_view backend, std::string_view jax_version,
                        std::string_view evaluator);

}  // namespace maxkernel::tpu_nodes
