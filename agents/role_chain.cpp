#include "agents/role_chain.hpp"

#include "maxkernel/schema/common.capnp.h"
#include "messages/payload_codec.hpp"

#include <capnp/message.h>
#include <kj/exception.h>

#include <algorithm>
#include <string>

namespace maxkernel::agents {
namespace {

using messages::error_code;
using messages::make_error;
using messages::payload;
using result = std::variant<payload, caf::error>;

caf::error to_error(const brain_status& s) { return make_error(s.code, s.message); }

template <class Request, class Reply, class Brain, class Call, class Done>
result run(const std::vector<std::shared_ptr<Brain>>& chain, const payload& request,
           const char* what, Call call, Done done) {
  std::string err;
  auto msg = messages::open_payload<Request>(request, err);
  if (!msg)
    return make_error(error_code::malformed_message, std::string(what) + ": " + err);
  if (chain.empty())
    return make_error(error_code::bad_input, std::string(what) + ": no brain configured");
  // The full walk passed when it was decoded; brains read the analysis many times over.
  msg->allow_rereading();
  try {
    auto req = msg->template root<Request>();
    capnp::MallocMessageBuilder usage_msg;
    auto usage = usage_msg.initRoot<schema::Usage>();
    std::optional<caf::error> last_error;
    std::unique_ptr<capnp::MallocMessageBuilder> last;
    for (const auto& brain : chain) {
      auto out = std::make_unique<capnp::MallocMessageBuilder>();
      auto reply = out->template initRoot<Reply>();
      auto status = call(*brain, req, reply);
      add_usage(usage, reply.getUsage().asReader());
      if (!status.ok()) {
        last_error = to_error(status);
        continue;
      }
      last = std::move(out);
      if (done(reply.asReader()))
        break;
    }
    if (!last)
      return *last_error;
    auto reply = last->template getRoot<Reply>();
    reply.setSchemaVersion(schema::SCHEMA_VERSION);
    reply.setUsage(usage.asReader());
    return messages::make_payload<Reply>(*last);
  } catch (const kj::Exception& e) {
    return make_error(error_code::malformed_message,
                      std::string(what) + ": " + e.getDescription().cStr());
  }
}

}  // namespace

void add_usage(schema::Usage::Builder into, schema::Usage::Reader more) {
  into.setPromptTokens(into.getPromptTokens() + more.getPromptTokens());
  into.setCompletionTokens(into.getCompletionTokens() + more.getCompletionTokens());
  into.setCalls(into.getCalls() + more.getCalls());
  into.setCostUsd(into.getCostUsd() + more.getCostUsd());
  into.setHasCost(into.getHasCost() || more.getHasCost());
}

result run_planners(const std::vector<planner_brain_ptr>& chain, const payload& request) {
  return run<schema::PlannerRequest, schema::Plan>(
    chain, request, "PlannerRequest",
    [](planner_brain& b, schema::PlannerRequest::Reader r, schema::Plan::Builder out) {
      return b.plan(r, out);
    },
    [](schema::Plan::Reader p) { return p.getSteps().size() > 0; });
}

result run_implementers(const std::vector<implementer_brain_ptr>& chain,
                        const payload& request) {
  // The brain the plan step names goes first.
  std::vector<implementer_brain_ptr> order = chain;
  std::string err;
  if (auto msg = messages::open_payload<schema::ImplementRequest>(request, err)) {
    try {
      std::string wanted = msg->root<schema::ImplementRequest>().getStep().getBrain().cStr();
      std::stable_partition(order.begin(), order.end(),
                            [&](const implementer_brain_ptr& b) { return b->name() == wanted; });
    } catch (const kj::Exception&) {
      // run() reports the malformed request.
    }
  }
  return run<schema::ImplementRequest, schema::ImplementReply>(
    order, request, "ImplementRequest",
    [](implementer_brain& b, schema::ImplementRequest::Reader r,
       schema::ImplementReply::Builder out) { return b.implement(r, out); },
    [](schema::ImplementReply::Reader) { return true; });
}

result run_debuggers(const std::vector<debugger_brain_ptr>& chain, const payload& request) {
  return run<schema::DebugRequest, schema::DebugReply>(
    chain, request, "DebugRequest",
    [](debugger_brain& b, schema::DebugRequest::Reader r, schema::DebugReply::Builder out) {
      return b.debug(r, out);
    },
    [](schema::DebugReply::Reader d) { return d.getRepaired(); });
}

}  // namespace maxkernel::agents
