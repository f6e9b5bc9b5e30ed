// The name of an operator's decision (messages/schema/operator.capnp): the word the operator
// types at `maxkernel attach` (approve, reject, edit, hint, takeover, handover, stop), used
// wherever a decision is shown (the console, progress lines, the report's transcript).
#pragma once

#include "maxkernel/schema/operator.capnp.h"

namespace maxkernel::messages {

const char* decision_kind_name(schema::DecisionKind kind);

}  // namespace maxkernel::messages
