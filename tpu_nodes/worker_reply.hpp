// What a JAX worker answers (schema::WorkerReply), read as worker_client reads it: its own
// file so that the fuzz target (tests/fuzz) runs the client's own checks without a worker.
#pragma once

#include "maxkernel/schema/worker.capnp.h"

#include <cstdint>
#include <string>
#include <vector>

namespace maxkernel::tpu_nodes {

// Outcome of one request: on success `bytes` holds the reply's payload as its own message
// (a KernelSpec, DataflowGraph or EvalResult); otherwise the error class and message.
struct worker_result {
  bool ok = false;
  std::string bytes;
  schema::ErrorClass error_class = schema::ErrorClass::NONE;
  std::string message;
};

// What the worker said of itself at start.
struct worker_description {
  long pid = 0;
  std::string jax_version;
  std::string platform;
  unsigned devices = 0;
  std::vector<std::string> sandbox;
};

enum class reply_check { ok, malformed, wrong_id };

// A reply frame for the request `id`: malformed (with `error`) unless every pointer reads
// and the schema version is ours.
reply_check check_worker_reply(const std::string& bytes, uint64_t id, std::string& error);

// The payload of a reply of kind `expected` as its own message, or the worker's error.
worker_result unwrap_worker_reply(const worker_result& raw, schema::WorkerReply::Which expected);

// The WorkerInfo of a pong into `out`; false (and `out` untouched) when it does not decode.
bool read_worker_info(const std::string& bytes, worker_description& out);

}  // namespace maxkernel::tpu_nodes
