// Requests for the LLM brain's tests: a bf16 matmul task on v5e (spec, analyze summary),
// a history candidate with a modeled profile and diagnosis, a failed evaluation; and an
// llm_config pointing at a replay server.
#pragma once

#include "config/brain_config.hpp"
#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "tests/agents/llm/replay_process.hpp"

#include <capnp/message.h>

#include <fstream>
#include <sstream>
#include <string>

namespace maxkernel::tests {

inline constexpr const char* key_env = "MAXKERNEL_TEST_LLM_KEY";
inline constexpr const char* key_value = "sk-replay-0123456789abcdef";  // make_exchanges.py's KEY
// The history candidate the recorded plan refers to by the prefix a1b2c3d4e5.
inline constexpr const char* history_id =
    "a1b2c3d4e5f60000000000000000000000000000000000000000000000000000";

inline std::string exchange_file(const std::string& name) {
  std::ifstream in(std::string(MAXKERNEL_LLM_EXCHANGES_DIR) + "/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline config::llm_config replay_config(const replay_process& server) {
  config::llm_config c;
  c.base_url = server.base_url();
  c.model = "replay-model";
  c.api_key_env = key_env;
  c.temperature = 0.2;
  c.max_tokens = 2048;
  c.timeout_seconds = 5;
  c.retries = 2;
  c.backoff_seconds = 0.01;
  return c;
}

inline void build_tensor(schema::TensorType::Builder t, std::initializer_list<int64_t> shape,
                         const char* dtype) {
  auto s = t.initShape(static_cast<unsigned>(shape.size()));
  unsigned i = 0;
  for (int64_t d : shape)
    s.set(i++, d);
  t.setDtype(dtype);
}

inline void build_spec(schema::KernelSpec::Builder spec) {
  spec.setSchemaVersion(schema::SCHEMA_VERSION);
  spec.setName("tiled_matmul");
  spec.setDescription("x @ w in bfloat16");
  spec.setReference("import jax.numpy as jnp\n\n\ndef workload(x, w):\n"
                    "    return jnp.dot(x, w, preferred_element_type=jnp.float32)"
                    ".astype(x.dtype)\n");
  spec.setReferenceEntry("workload");
  spec.setChip("v5e");
  auto cfg = spec.initConfigurations(1)[0];
  cfg.setName("full");
  auto inputs = cfg.initInputs(2);
  inputs[0].setName("x");
  build_tensor(inputs[0].initType(), {256, 512}, "bfloat16");
  inputs[1].setName("w");
  build_tensor(inputs[1].initType(), {512, 256}, "bfloat16");
  build_tensor(cfg.initOutputs(1)[0], {256, 256}, "bfloat16");
  auto tol = spec.initTolerances(1)[0];
  tol.setAtol(1e-2);
  tol.setRtol(1e-2);
  spec.setFlops(2.0 * 256 * 512 * 256);
}

inline void build_analysis(schema::DataflowGraph::Builder g) {
  build_tensor(g.initInputs(2)[0], {256, 512}, "bfloat16");
  build_tensor(g.getInputs()[1], {512, 256}, "bfloat16");
  auto n = g.initNodes(1)[0];
  n.setId(0);
  n.setPrimitive("dot_general");
  n.setParams(R"({"dimension_numbers": [[[1], [0]], [[], []]]})");
  build_tensor(n.initOperands(2)[0], {256, 512}, "bfloat16");
  build_tensor(n.getOperands()[1], {512, 256}, "bfloat16");
  build_tensor(n.initResults(1)[0], {256, 256}, "bfloat16");
  auto ids = n.initOperandIds(2);
  ids.set(0, -1);
  ids.set(1, -1);
  auto ins = n.initOperandInputs(2);
  ins.set(0, 0);
  ins.set(1, 1);
  n.initOperandLiterals(2);
  n.setFlops(2.0 * 256 * 512 * 256);
  build_tensor(g.initOutputs(1)[0], {256, 256}, "bfloat16");
  g.initOutputIds(1).set(0, 0);
  g.initOutputInputs(1).set(0, -1);
  g.setFlops(2.0 * 256 * 512 * 256);
  g.setMinBytes(2.0 * (256 * 512 + 512 * 256 + 256 * 256));
  g.setBytes(g.getMinBytes());
}

inline void build_candidate(schema::Candidate::Builder c, const std::string& id,
                            const std::string& source) {
  c.setSchemaVersion(schema::SCHEMA_VERSION);
  c.setId(id);
  c.setSource(source);
  c.setOrigin("expert");
  c.setTemplate("");
}

// A correct candidate with a modeled, memory-bound profile and the profiler's diagnosis.
inline void build_history_entry(schema::HistoryEntry::Builder e) {
  build_candidate(e.initCandidate(), history_id, exchange_file("matmul.py"));
  auto r = e.initResult();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  r.setCandidateId(history_id);
  r.setCorrect(true);
  r.setHasProfile(true);
  r.setBackend("model");
  auto p = r.initProfile();
  p.setTiming(schema::Timing::MODELED);
  p.setChip("v5e");
  p.setTimeUs(4.2);
  p.setRooflineUs(1.72);
  p.setBound("memory");
  p.setBackend("model");
  auto d = e.initDiagnosis();
  e.setHasDiagnosis(true);
  d.setBound("memory");
  d.setTimeUs(4.2);
  d.setRooflineUs(1.72);
  d.setHeadroomUs(2.48);
  auto s = d.initSuggestions(1)[0];
  s.setKind(schema::SuggestionKind::GROW_BLOCK);
  s.setAxis(1);
  s.setFactor(4);
  s.setRationale("matmul is memory-bound at 41% of HBM bandwidth; input 0 is copied 4 times "
                 "along grid axis 1: grow the blocks along axis 1 4x");
}

// The lowering failure of misaligned.py (its real message from JAX 0.10.2).
inline void build_lowering_failure(schema::EvalResult::Builder r, const std::string& id) {
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  r.setCandidateId(id);
  r.setCorrect(false);
  auto phases = r.initPhases(2);
  phases[0].setPhase(schema::Phase::LOAD);
  phases[0].setStatus(schema::Status::OK);
  phases[1].setPhase(schema::Phase::LOWER);
  phases[1].setStatus(schema::Status::FAILED);
  phases[1].setErrorClass(schema::ErrorClass::LOWER_BLOCK_SHAPE);
  phases[1].setMessage(exchange_file("lower_error.txt"));
}

}  // namespace maxkernel::tests
