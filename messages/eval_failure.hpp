// How an EvalResult failed, in the words of eval.capnp: the first failed phase's error class
// name ("lowerBlockShape", "vmemOom", ...) and message. Shared by the debugger's rules, the
// supervisors' failure tallies and the commands' reports.
#pragma once

#include "maxkernel/schema/eval.capnp.h"

#include <string>

namespace maxkernel::messages {

// The enumerant's name in eval.capnp ("unknown" past the known ones).
std::string error_class_name(schema::ErrorClass cls);
// The first failed phase's class; "none" for a correct result, "mismatch" for one that is
// not correct with no failed phase (a verdict of the tester's cases).
std::string failure_class(schema::EvalResult::Reader result);
// The first failed phase's message; "" when no phase failed.
std::string failure_message(schema::EvalResult::Reader result);
// The EvalResult (encoded) of a candidate whose evaluation the node's deadline cut
// (worker_timeout): its test failed with class timeout, `why` its message. A hanging kernel
// is the candidate's failure, as a crashing one is.
std::string timeout_result(const std::string& why);

}  // namespace maxkernel::messages
