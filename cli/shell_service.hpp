// What a cluster supervisor answers to an operator shell's command (`maxkernel shell`;
// docs/cluster.md lists the commands): the cluster's nodes, the tasks submitted to it (one
// directory each under STATE/submissions/) with their outputs, and the operator's actions on
// the dispatcher (drain) and on running searches (stop, pause, resume, budget). Pure of
// sockets: the submission server calls it.
#pragma once

#include "cli/node_session.hpp"
#include "cli/search_controls.hpp"
#include "maxkernel/schema/submission.capnp.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

namespace maxkernel::cli {

struct shell_context {
  node_session& session;
  std::string state_dir;
  std::string node_endpoint;       // HOST:PORT nodes join at (for `scale`)
  bool with_token = false;         // whether nodes need --token-file
  std::set<std::string> running;   // submission ids running in this process
  search_controls* controls = nullptr;  // their searches (stop, pause, resume, budget)
};

// Answers one command (its words) into `reply`.
void answer_shell(shell_context& ctx, const std::vector<std::string>& words,
                  schema::ShellReply::Builder reply);

// The commands and what they do, for `help` and the shell's completion.
const std::vector<std::pair<std::string, std::string>>& shell_commands();

}  // namespace maxkernel::cli
