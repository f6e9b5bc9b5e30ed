#include "messages/decision_kind.hpp"

namespace maxkernel::messages {

const char* decision_kind_name(schema::DecisionKind kind) {
  switch (kind) {
    case schema::DecisionKind::APPROVE: return "approve";
    case schema::DecisionKind::REJECT: return "reject";
    case schema::DecisionKind::EDIT: return "edit";
    case schema::DecisionKind::HINT: return "hint";
    case schema::DecisionKind::TAKE_OVER: return "takeover";
    case schema::DecisionKind::HAND_OVER: return "handover";
    case schema::DecisionKind::STOP: return "stop";
  }
  return "unknown";
}

}  // namespace maxkernel::messages
