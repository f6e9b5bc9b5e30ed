// A client of one Python JAX worker over ZeroMQ (ipc). It owns the worker process: a request
// that passes its deadline, or a worker that dies while serving it, becomes a classified
// failure (timeout, crash) and the worker is restarted before the next request.
#pragma once

#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "tpu_nodes/worker_options.hpp"
#include "tpu_nodes/worker_reply.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace maxkernel::tpu_nodes {

class worker_process;

enum class eval_kind { lower, extract, test, time };

class worker_client {
public:
  explicit worker_client(worker_options opts);
  ~worker_client();
  worker_client(const worker_client&) = delete;
  worker_client& operator=(const worker_client&) = delete;

  // Starts the worker and waits for its first pong.
  bool start(std::string& error);
  const worker_description& description() const { return description_; }
  unsigned restarts() const { return restarts_; }

  // KernelSpec of a JAXBench or MaxKernel task directory.
  worker_result load_task(const std::string& path, uint64_t memory_limit_bytes,
                          std::chrono::milliseconds deadline);
  // DataflowGraph of the spec's reference.
  worker_result analyze(schema::KernelSpec::Reader spec, unsigned configuration,
                        std::chrono::milliseconds deadline);
  // EvalResult. A timeout or crash is answered with an EvalResult whose phase failed with
  // that class, since it is the candidate's doing.
  worker_result evaluate(eval_kind kind, schema::EvalRequest::Reader request,
                         std::chrono::milliseconds deadline);
  worker_result ping(std::chrono::milliseconds deadline);

  // Sends an encoded WorkerRequest and returns the encoded WorkerReply.
  worker_result call(const std::string& request, uint64_t id, std::chrono::milliseconds deadline);

private:
  struct zmq_state;
  enum class exchange_outcome { reply, unsendable, bad_reply, wrong_id, died, timeout };
  struct exchange_result {
    exchange_outcome outcome = exchange_outcome::timeout;
    std::string bytes = {};   // the encoded WorkerReply, for `reply`
    std::string detail = {};  // why the reply is bad, or how the worker died
  };
  // Sends one request and waits for its reply, the worker's death or the deadline.
  exchange_result exchange(const std::string& request, uint64_t id,
                           std::chrono::milliseconds deadline);
  bool restart(std::string& error);

  worker_options opts_;
  std::unique_ptr<worker_process> process_;
  std::unique_ptr<zmq_state> zmq_;
  worker_description description_;
  uint64_t next_id_ = 1;
  unsigned restarts_ = 0;
};

const char* to_string(eval_kind kind);

}  // namespace maxkernel::tpu_nodes
