#include "inbound_types.hpp"

#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/candidate.capnp.h"
#include "maxkernel/schema/cluster.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "maxkernel/schema/kernel_structure.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "maxkernel/schema/operator.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "maxkernel/schema/submission.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/eval_failure.hpp"
#include "messages/payload_codec.hpp"
#include "tpu_nodes/checked_payload.hpp"
#include "tpu_nodes/request_key.hpp"

#include <cstdio>
#include <cstdlib>

namespace maxkernel::fuzz {

namespace {

// A message the planned check accepts must read field by field without an exception, and
// the other way round: consumers rely on decode<T> for every later read.
template <class T>
void same_verdict_as_dynamic(const std::string& bytes, bool planned_ok,
                             const std::string& planned_error) {
  std::string error;
  auto msg = messages::decoded_message::parse(bytes, error);
  if (!msg)
    return;
  bool dynamic_ok = messages::check_traversal_dynamic(*msg, capnp::Schema::from<T>(), error);
  if (planned_ok != dynamic_ok) {
    std::fprintf(stderr, "check_traversal %s, check_traversal_dynamic %s: %s%s\n",
                 planned_ok ? "accepts" : "refuses", dynamic_ok ? "accepts" : "refuses",
                 planned_error.c_str(), error.c_str());
    std::abort();
  }
}

// What every receiver of a payload does first (messages::open_payload).
template <class T>
std::optional<messages::decoded_message> open(const std::string& bytes) {
  std::string error;
  auto msg = messages::open_payload<T>(messages::payload{capnp::typeId<T>(), bytes}, error);
  same_verdict_as_dynamic<T>(bytes, msg.has_value(), error);
  return msg;
}

template <class T>
void plain(const std::string& bytes) {
  (void)open<T>(bytes);
}

// The node's hot path (tpu_nodes::open_checked: bounds only) and what it reads next; a
// field that does not read throws kj::Exception, which the node answers malformed_message.
void eval_request(const std::string& bytes) {
  if (auto msg = open<schema::EvalRequest>(bytes)) {
    auto r = msg->root<schema::EvalRequest>();
    (void)tpu_nodes::request_key(r, "v6e", "jax-tpu", "0.4.35", "");
  }
  std::string error;
  auto msg = tpu_nodes::open_checked<schema::EvalRequest>(bytes, error);
  if (!msg)
    return;
  try {
    auto r = msg->root<schema::EvalRequest>();
    std::string name = r.getSpec().getName();
    std::string id = r.getCandidate().getId();
    (void)tpu_nodes::request_key(r, "v6e", "jax-tpu", "0.4.35", "");
    (void)tpu_nodes::spec_hash(r.getSpec());
  } catch (const kj::Exception&) {
  }
}

void eval_result(const std::string& bytes) {
  if (auto msg = open<schema::EvalResult>(bytes)) {
    auto r = msg->root<schema::EvalResult>();
    (void)messages::failure_class(r);
    (void)messages::failure_message(r);
  }
  std::string error;
  auto msg = tpu_nodes::open_checked<schema::EvalResult>(bytes, error);
  if (!msg)
    return;
  try {
    auto r = msg->root<schema::EvalResult>();
    (void)messages::failure_class(r);
    (void)messages::failure_message(r);
  } catch (const kj::Exception&) {
  }
}

void node_info(const std::string& bytes) {
  if (auto msg = open<schema::NodeInfo>(bytes))
    (void)std::string(msg->root<schema::NodeInfo>().getNodeId());
  std::string error;
  if (auto msg = tpu_nodes::open_checked<schema::NodeInfo>(bytes, error)) {
    try {
      (void)std::string(msg->root<schema::NodeInfo>().getNodeId());
    } catch (const kj::Exception&) {
    }
  }
}

template <class T>
inbound_type entry(const char* name, void (*receive)(const std::string&) = &plain<T>) {
  return {name, capnp::typeId<T>(), capnp::Schema::from<T>(), receive};
}

}  // namespace

const std::vector<inbound_type>& inbound_types() {
  static const std::vector<inbound_type> types = {
    // cluster: dispatcher <-> nodes (CAF)
    entry<schema::EvalRequest>("EvalRequest", &eval_request),
    entry<schema::EvalResult>("EvalResult", &eval_result),
    entry<schema::NodeInfo>("NodeInfo", &node_info),
    entry<schema::DispatcherStatus>("DispatcherStatus"),
    entry<schema::AnalyzeRequest>("AnalyzeRequest"),
    entry<schema::KernelSpec>("KernelSpec"),
    entry<schema::DataflowGraph>("DataflowGraph"),
    entry<schema::KernelStructure>("KernelStructure"),
    entry<schema::Progress>("Progress"),
    entry<schema::OptimizeRequest>("OptimizeRequest"),
    entry<schema::OptimizeResult>("OptimizeResult"),
    entry<schema::Vertex>("Vertex"),
    entry<schema::Candidate>("Candidate"),
    // agents (actors that may run in another process)
    entry<schema::Plan>("Plan"),
    entry<schema::TestPlan>("TestPlan"),
    entry<schema::ImplementRequest>("ImplementRequest"),
    entry<schema::ImplementReply>("ImplementReply"),
    entry<schema::Verdict>("Verdict"),
    entry<schema::DebugReply>("DebugReply"),
    entry<schema::Diagnosis>("Diagnosis"),
    entry<schema::ProfilerRequest>("ProfilerRequest"),
    // operator gateway (ZeroMQ)
    entry<schema::OperatorCommand>("OperatorCommand"),
    entry<schema::OperatorEvent>("OperatorEvent"),
    entry<schema::Proposal>("Proposal"),
    entry<schema::Decision>("Decision"),
    entry<schema::TranscriptEntry>("TranscriptEntry"),
    // the JAX worker and the client port (their own targets read them as their receivers do)
    entry<schema::WorkerReply>("WorkerReply"),
    entry<schema::WorkerInfo>("WorkerInfo"),
    entry<schema::ClientRequest>("ClientRequest"),
    entry<schema::ClientEvent>("ClientEvent"),
  };
  return types;
}

void receive_payload(uint64_t type_id, const std::string& bytes) {
  for (const auto& t : inbound_types())
    if (t.id == type_id)
      return t.receive(bytes);
}

}  // namespace maxkernel::fuzz
