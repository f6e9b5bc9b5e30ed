// Messages about a user's kernel name the user's file, not the worker's private copy of it.
#include "cli/candidate_path.hpp"

#include <gtest/gtest.h>

namespace cli = maxkernel::cli;

TEST(CandidatePath, TheWorkersCopyIsNamedByTheUsersFile) {
  std::string msg =
      "/tmp/maxkernel-worker-huX1uo/private/candidates/maxkernel_candidate_a39a5df46c92dd26.py:"
      "244: UnboundLocalError: cannot access local variable 'offsets'";
  EXPECT_EQ(cli::with_kernel_path(msg, "kernels/my kernel.py"),
            "kernels/my kernel.py:244: UnboundLocalError: cannot access local variable 'offsets'");
}

TEST(CandidatePath, EveryMentionInATracebackAndNothingElse) {
  std::string msg =
      "File \"/w/candidates/maxkernel_candidate_0123456789abcdef.py\", line 3, in workload\n"
      "File \"/w/candidates/maxkernel_candidate_0123456789abcdef.py\", line 9, in _f\n"
      "File \"/usr/lib/python3/jax/core.py\", line 1, in bind";
  auto out = cli::with_kernel_path(msg, "/home/u/k$1.py");  // '$1' is not a back-reference
  EXPECT_EQ(out, "File \"/home/u/k$1.py\", line 3, in workload\n"
                 "File \"/home/u/k$1.py\", line 9, in _f\n"
                 "File \"/usr/lib/python3/jax/core.py\", line 1, in bind");
}

TEST(CandidatePath, MessagesWithoutTheCopyAreUnchanged) {
  EXPECT_EQ(cli::with_kernel_path("block shape (8, 100) is not divisible by 8 and 128", "k.py"),
            "block shape (8, 100) is not divisible by 8 and 128");
  // a name that only looks like it (not 16 hex digits) is left alone
  EXPECT_EQ(cli::with_kernel_path("maxkernel_candidate_xyz.py:1: E", "k.py"),
            "maxkernel_candidate_xyz.py:1: E");
  EXPECT_EQ(cli::with_kernel_path("maxkernel_candidate_0123456789abcdef.py:1: E", ""),
            "maxkernel_candidate_0123456789abcdef.py:1: E");
}
