#include "tpu_nodes/worker_reply.hpp"

#include "messages/capnp_io.hpp"

namespace maxkernel::tpu_nodes {

reply_check check_worker_reply(const std::string& bytes, uint64_t id, std::string& error) {
  auto msg = messages::decode<schema::WorkerReply>(bytes, error);
  if (!msg)
    return reply_check::malformed;
  if (msg->root<schema::WorkerReply>().getId() != id)
    return reply_check::wrong_id;
  return reply_check::ok;
}

worker_result unwrap_worker_reply(const worker_result& raw, schema::WorkerReply::Which expected) {
  if (!raw.ok)
    return raw;
  worker_result out;
  std::string err;
  auto msg = messages::decode<schema::WorkerReply>(raw.bytes, err);
  if (!msg) {  // checked when it arrived; a caller's own bytes may not be
    out.error_class = schema::ErrorClass::INTERNAL;
    out.message = "the worker sent a bad reply: " + err;
    return out;
  }
  auto reply = msg->root<schema::WorkerReply>();
  if (reply.which() == schema::WorkerReply::ERROR) {
    auto e = reply.getError();
    out.error_class = e.getErrorClass();
    out.message = e.getMessage();
    return out;
  }
  if (reply.which() != expected) {
    out.error_class = schema::ErrorClass::INTERNAL;
    out.message = "the worker answered with another kind of reply";
    return out;
  }
  out.ok = true;
  switch (expected) {
    case schema::WorkerReply::PONG: out.bytes = messages::encode_root(reply.getPong()); break;
    case schema::WorkerReply::SPEC: out.bytes = messages::encode_root(reply.getSpec()); break;
    case schema::WorkerReply::GRAPH: out.bytes = messages::encode_root(reply.getGraph()); break;
    case schema::WorkerReply::EVAL: out.bytes = messages::encode_root(reply.getEval()); break;
    default: break;
  }
  return out;
}

bool read_worker_info(const std::string& bytes, worker_description& out) {
  std::string err;
  auto msg = messages::decode<schema::WorkerInfo>(bytes, err);
  if (!msg)
    return false;
  auto info = msg->root<schema::WorkerInfo>();
  out.pid = info.getPid();
  out.jax_version = info.getJaxVersion();
  out.platform = info.getPlatform();
  out.devices = info.getDevices();
  out.sandbox.clear();
  for (auto s : info.getSandbox())
    out.sandbox.emplace_back(s.cStr());
  return true;
}

}  // namespace maxkernel::tpu_nodes
