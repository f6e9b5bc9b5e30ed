// The kernel diff an operator reads in a hitl proposal: a unified diff of a candidate's
// source against its parent's (dtl's shortest edit script, 3 lines of context). CAF-free.
#pragma once

#include <string>

namespace maxkernel::actors {

// "" when the sources are equal; a first candidate is diffed against an empty `before`.
std::string unified_diff(const std::string& before, const std::string& after,
                         const std::string& before_name, const std::string& after_name);

}  // namespace maxkernel::actors
