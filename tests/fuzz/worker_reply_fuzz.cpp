// A frame from the JAX worker, read as tpu_nodes::worker_client reads it (worker_reply):
// checked, unwrapped as each kind of request expects, and the unwrapped payload decoded as
// its consumers decode it (WorkerInfo at start, KernelSpec, DataflowGraph, EvalResult).
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "maxkernel/schema/kernel_structure.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/eval_failure.hpp"
#include "tpu_nodes/worker_reply.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace maxkernel;
  using tpu_nodes::reply_check;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  std::string error;
  // The id the client waits for is its own; a reply to another one is refused as well.
  if (tpu_nodes::check_worker_reply(bytes, 1, error) == reply_check::malformed)
    return 0;
  for (auto kind : {schema::WorkerReply::PONG, schema::WorkerReply::SPEC,
                    schema::WorkerReply::GRAPH, schema::WorkerReply::EVAL}) {
    auto out = tpu_nodes::unwrap_worker_reply({true, bytes, {}, {}}, kind);
    if (!out.ok)
      continue;
    switch (kind) {
      case schema::WorkerReply::PONG: {
        tpu_nodes::worker_description d;
        (void)tpu_nodes::read_worker_info(out.bytes, d);
        break;
      }
      case schema::WorkerReply::SPEC:
        (void)messages::decode<schema::KernelSpec>(out.bytes, error);
        break;
      case schema::WorkerReply::GRAPH:
        (void)messages::decode<schema::DataflowGraph>(out.bytes, error);
        break;
      case schema::WorkerReply::EVAL:
        if (auto m = messages::decode<schema::EvalResult>(out.bytes, error)) {
          (void)messages::failure_class(m->root<schema::EvalResult>());
          (void)messages::failure_message(m->root<schema::EvalResult>());
        }
        break;
      default: break;
    }
  }
  return 0;
}
