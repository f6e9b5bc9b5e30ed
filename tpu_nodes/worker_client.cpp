#include "tpu_nodes/worker_client.hpp"

#include "messages/capnp_io.hpp"
#include "tpu_nodes/worker_process.hpp"

#include <capnp/message.h>
#include <zmq.hpp>

#include <thread>

namespace maxkernel::tpu_nodes {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

struct worker_client::zmq_state {
  zmq::context_t context{1};
  std::unique_ptr<zmq::socket_t> socket;

  void connect(const std::string& endpoint) {
    socket = std::make_unique<zmq::socket_t>(context, zmq::socket_type::req);
    socket->set(zmq::sockopt::linger, 0);
    socket->connect(endpoint);
  }
  void reset() {
    if (socket)
      socket->close();
    socket.reset();
  }
};

const char* to_string(eval_kind kind) {
  switch (kind) {
    case eval_kind::lower: return "lower";
    case eval_kind::extract: return "extract";
    case eval_kind::test: return "test";
    case eval_kind::time: return "time";
  }
  return "?";
}

worker_client::worker_client(worker_options opts)
  : opts_(std::move(opts)), zmq_(std::make_unique<zmq_state>()) {
}

worker_client::~worker_client() {
  if (process_ && process_->alive() && zmq_->socket) {
    // Ask politely so the worker removes its socket; the process is killed regardless.
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::WorkerRequest>();
    req.setId(0);
    req.setShutdown();
    auto bytes = messages::encode(msg);
    zmq_->socket->send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  }
  zmq_->reset();
  process_.reset();
}

bool worker_client::start(std::string& error) {
  return restart(error);
}

bool worker_client::restart(std::string& error) {
  zmq_->reset();
  if (!process_)
    process_ = std::make_unique<worker_process>(opts_);
  if (!process_->start(error))
    return false;
  zmq_->connect(process_->endpoint());
  auto pong = ping(opts_.start_timeout);
  if (!pong.ok) {
    error = "the JAX worker did not start: " + pong.message;
    auto tail = process_->log_tail();
    if (!tail.empty())
      error += "\n--- worker log ---\n" + tail;
    process_->kill();
    return false;
  }
  read_worker_info(pong.bytes, description_);
  return true;
}

worker_result worker_client::call(const std::string& request, uint64_t id,
                                  std::chrono::milliseconds deadline) {
  worker_result out;
  if (!process_ || !zmq_->socket) {
    out.error_class = schema::ErrorClass::INTERNAL;
    out.message = "the worker is not started";
    return out;
  }
  auto fail_and_restart = [&](schema::ErrorClass cls, std::string message) {
    out.error_class = cls;
    out.message = std::move(message);
    process_->kill();
    ++restarts_;
    std::string err;
    if (!restart(err))
      out.message += "; restarting the worker failed: " + err;
    return out;
  };
  auto ex = exchange(request, id, deadline);
  switch (ex.outcome) {
    case exchange_outcome::reply:
      out.ok = true;
      out.bytes = std::move(ex.bytes);
      return out;
    case exchange_outcome::unsendable:
      return fail_and_restart(schema::ErrorClass::CRASH, "the worker does not accept requests");
    case exchange_outcome::bad_reply:
      return fail_and_restart(schema::ErrorClass::INTERNAL, "the worker sent a bad reply: " + ex.detail);
    case exchange_outcome::wrong_id:
      return fail_and_restart(schema::ErrorClass::INTERNAL, "the worker answered another request");
    case exchange_outcome::died:
      // Out of host memory is the candidate's (or the task's) size, not a crash of its code.
      if (process_->oom_killed())
        return fail_and_restart(schema::ErrorClass::RESOURCE_LIMIT,
                                "out of memory: the worker was killed (" + ex.detail
                                  + ") while serving the request");
      return fail_and_restart(schema::ErrorClass::CRASH,
                              "the worker died (" + ex.detail + ") while serving the request");
    case exchange_outcome::timeout:
      break;
  }
  return fail_and_restart(schema::ErrorClass::TIMEOUT,
                          "no answer within " + std::to_string(deadline.count() / 1000.0).substr(0, 6)
                            + " s; the worker was restarted");
}

worker_client::exchange_result worker_client::exchange(const std::string& request, uint64_t id,
                                                       std::chrono::milliseconds deadline) {
  if (!zmq_->socket->send(zmq::buffer(request), zmq::send_flags::dontwait))
    return {exchange_outcome::unsendable};
  auto until = clock_type::now() + deadline;
  for (;;) {
    // Short polls so that a dead worker is noticed at once, not at the deadline.
    zmq::pollitem_t items[] = {{zmq_->socket->handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, 50ms);
    if (items[0].revents & ZMQ_POLLIN) {
      zmq::message_t reply;
      if (!zmq_->socket->recv(reply, zmq::recv_flags::dontwait))
        continue;
      std::string bytes(static_cast<const char*>(reply.data()), reply.size());
      std::string err;
      switch (check_worker_reply(bytes, id, err)) {
        case reply_check::malformed: return {exchange_outcome::bad_reply, {}, err};
        case reply_check::wrong_id: return {exchange_outcome::wrong_id};
        case reply_check::ok: return {exchange_outcome::reply, std::move(bytes)};
      }
      return {exchange_outcome::bad_reply, {}, err};
    }
    if (!process_->alive())
      return {exchange_outcome::died, {}, process_->exit_description()};
    if (clock_type::now() >= until)
      return {exchange_outcome::timeout};
  }
}

worker_result worker_client::ping(std::chrono::milliseconds deadline) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::WorkerRequest>();
  auto id = next_id_++;
  req.setId(id);
  req.setPing();
  if (!process_ || !zmq_->socket)
    return {false, {}, schema::ErrorClass::INTERNAL, "the worker is not started"};
  // Not through call(): a failed ping at start must not recurse into restart().
  auto ex = exchange(messages::encode(msg), id, deadline);
  switch (ex.outcome) {
    case exchange_outcome::reply: {
      worker_result raw;
      raw.ok = true;
      raw.bytes = std::move(ex.bytes);
      return unwrap_worker_reply(raw, schema::WorkerReply::PONG);
    }
    case exchange_outcome::died:
      return {false, {}, schema::ErrorClass::CRASH, "the worker exited (" + ex.detail + ")"};
    case exchange_outcome::timeout:
      return {false, {}, schema::ErrorClass::TIMEOUT, "no answer to ping"};
    case exchange_outcome::bad_reply:
      return {false, {}, schema::ErrorClass::INTERNAL, "bad reply to ping: " + ex.detail};
    default:
      return {false, {}, schema::ErrorClass::INTERNAL, "the worker does not answer pings"};
  }
}

worker_result worker_client::load_task(const std::string& path, uint64_t memory_limit_bytes,
                                       std::chrono::milliseconds deadline) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::WorkerRequest>();
  auto id = next_id_++;
  req.setId(id);
  auto load = req.initLoad();
  load.setPath(path);
  load.setMemoryLimitBytes(memory_limit_bytes);
  return unwrap_worker_reply(call(messages::encode(msg), id, deadline), schema::WorkerReply::SPEC);
}

worker_result worker_client::analyze(schema::KernelSpec::Reader spec, unsigned configuration,
                                     std::chrono::milliseconds deadline) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::WorkerRequest>();
  auto id = next_id_++;
  req.setId(id);
  auto a = req.initAnalyze();
  a.setSpec(spec);
  a.setConfiguration(configuration);
  return unwrap_worker_reply(call(messages::encode(msg), id, deadline), schema::WorkerReply::GRAPH);
}

worker_result worker_client::evaluate(eval_kind kind, schema::EvalRequest::Reader request,
                                      std::chrono::milliseconds deadline) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::WorkerRequest>();
  auto id = next_id_++;
  req.setId(id);
  switch (kind) {
    case eval_kind::lower: req.setLower(request); break;
    case eval_kind::extract: req.setExtract(request); break;
    case eval_kind::test: req.setTest(request); break;
    case eval_kind::time: req.setTime(request); break;
  }
  auto raw = call(messages::encode(msg), id, deadline);
  if (!raw.ok && (raw.error_class == schema::ErrorClass::TIMEOUT
                  || raw.error_class == schema::ErrorClass::CRASH
                  || raw.error_class == schema::ErrorClass::RESOURCE_LIMIT)) {
    // The candidate hung, killed its process or ran it out of memory: that is a result,
    // not an error.
    capnp::MallocMessageBuilder result_msg;
    auto result = result_msg.initRoot<schema::EvalResult>();
    result.setSchemaVersion(schema::SCHEMA_VERSION);
    result.setCandidateId(request.getCandidate().getId());
    auto phase = result.initPhases(1)[0];
    phase.setPhase(kind == eval_kind::test   ? schema::Phase::TEST
                   : kind == eval_kind::time ? schema::Phase::PROFILE
                                             : schema::Phase::LOWER);
    phase.setStatus(schema::Status::FAILED);
    phase.setErrorClass(raw.error_class);
    phase.setMessage(raw.message);
    phase.setSeconds(std::chrono::duration<double>(deadline).count());
    worker_result out;
    out.ok = true;
    out.bytes = messages::encode(result_msg);
    return out;
  }
  return unwrap_worker_reply(raw, schema::WorkerReply::EVAL);
}

}  // namespace maxkernel::tpu_nodes
