// Messages about a user's kernel file in the user's terms. The worker imports a candidate
// from a private copy of its source (tpu_nodes/worker/maxkernel_worker/candidate.py:
// <workdir>/candidates/maxkernel_candidate_<16 hex digits>.py), so its tracebacks and
// errors name that copy; the copy's lines are the file's, so the file's path replaces it.
#pragma once

#include <string>

namespace maxkernel::cli {

std::string with_kernel_path(const std::string& message, const std::string& kernel_path);

}  // namespace maxkernel::cli
