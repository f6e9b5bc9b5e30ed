// EvalRequests for tests: a small bf16 matmul spec (native format, built in code) and
// candidate sources from the repository's test kernels.
#pragma once

#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "messages/content_hash.hpp"
#include "messages/payload_codec.hpp"

#include <capnp/message.h>

#include <fstream>
#include <sstream>
#include <string>

namespace maxkernel::test_support {

// MAXKERNEL_SOURCE_DIR is defined by the test target.
inline std::string source_file(const std::string& relative) {
  std::ifstream in(std::string(MAXKERNEL_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tests/worker/kernels/<name>.py
inline std::string test_kernel(const std::string& name) {
  return source_file("tests/worker/kernels/" + name + ".py");
}

inline const char* matmul_reference = R"(
import jax.numpy as jnp
def reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
)";

struct request_options {
  int64_t size = 256;          // square matmul of size x size bf16 matrices
  bool reference = false;      // evaluate the spec's reference instead
  std::string chip;            // options.chip ("" : the spec's, v6e)
  std::string candidate_id;    // "" : the source's sha256
};

inline void fill_matmul_spec(schema::KernelSpec::Builder spec, int64_t size) {
  spec.setSchemaVersion(schema::SCHEMA_VERSION);
  spec.setName("matmul_" + std::to_string(size));
  spec.setFormat(schema::SpecFormat::NATIVE);
  spec.setReference(matmul_reference);
  spec.setReferenceEntry("reference");
  spec.setChip("v6e");
  auto tol = spec.initTolerances(1)[0];
  tol.setOutput(-1);
  tol.setAtol(2e-2);
  tol.setRtol(2e-2);
  auto cfg = spec.initConfigurations(1)[0];
  cfg.setName("default");
  auto inputs = cfg.initInputs(2);
  const char* names[] = {"a", "b"};
  for (unsigned i = 0; i < 2; ++i) {
    inputs[i].setName(names[i]);
    auto type = inputs[i].initType();
    type.setDtype("bfloat16");
    auto shape = type.initShape(2);
    shape.set(0, size);
    shape.set(1, size);
    inputs[i].initGenerator().initNormal().setStd(1.0);
  }
  auto out = cfg.initOutputs(1)[0];
  out.setDtype("bfloat16");
  auto oshape = out.initShape(2);
  oshape.set(0, size);
  oshape.set(1, size);
}

inline messages::payload eval_request(const std::string& source, const request_options& o = {}) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::EvalRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  fill_matmul_spec(req.initSpec(), o.size);
  auto cand = req.initCandidate();
  cand.setSchemaVersion(schema::SCHEMA_VERSION);
  cand.setId(o.candidate_id.empty() ? messages::sha256_hex(source) : o.candidate_id);
  cand.setSource(source);
  auto options = req.initOptions();
  options.setChip(o.chip);
  req.setReference(o.reference);
  return messages::make_payload<schema::EvalRequest>(msg);
}

}  // namespace maxkernel::test_support
