// The command-line options of `optimize` (and the search settings `bench` shares), in one
// place: the program's parser and a cluster supervisor's parser of submitted options read
// them alike.
#pragma once

#include "cli/optimize_command.hpp"

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace maxkernel::cli {

// The settings of a task's search, shared by `optimize` and `bench`.
void add_search_options(CLI::App* cmd, optimize_options& opt, const std::vector<std::string>& chips);

// Every option of `optimize` (SPEC, mode, hitl, outputs and the search settings).
void add_optimize_options(CLI::App* cmd, optimize_options& opt, const std::vector<std::string>& chips);

// What `optimize --cluster` sends of its command line: every option as typed, except SPEC
// (its files travel instead) and the options that name this machine's files or the cluster
// itself (--out, --json, --cluster, --token-file).
std::vector<std::string> submitted_args(const CLI::App& optimize_cmd, int argc,
                                        const char* const* argv, const std::string& spec);

}  // namespace maxkernel::cli
