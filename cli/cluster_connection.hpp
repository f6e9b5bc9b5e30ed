// A client's connection to a cluster supervisor's client port (cli/submission_server): a
// ZeroMQ DEALER with the cluster's CURVE credentials and a fixed identity (a supervisor
// restarted with --resume finds the client again). Shared by `optimize --cluster`,
// `cluster status` and `maxkernel shell`.
#pragma once

#include "cli/optimize_command.hpp"
#include "maxkernel/schema/submission.capnp.h"

#include <chrono>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace maxkernel::cli {

struct cluster_client_options {
  std::string endpoint;    // the supervisor's client port, HOST:PORT
  std::string token_file;  // the cluster's credentials ("": no CURVE)
  double silence_seconds = 30;  // no word from the supervisor this long: it is gone (exit 3)
};

class cluster_connection {
public:
  cluster_connection();
  ~cluster_connection();
  cluster_connection(const cluster_connection&) = delete;
  cluster_connection& operator=(const cluster_connection&) = delete;

  // Connects: 0, or the exit code after writing why to `err` (2: a bad endpoint or
  // credentials file; 3: the supervisor refused our credentials, "authentication failed").
  int open(const cluster_client_options& client, std::ostream& err);
  void send(const std::string& request_bytes);
  // The next event's bytes, waiting at most `timeout`.
  std::optional<std::string> receive(std::chrono::milliseconds timeout);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// A ClientRequest: a shell command of `words`, or a status request.
std::string command_request(const std::vector<std::string>& words);
std::string status_request();

// A ClientRequest submitting `spec` (a file or a task directory, its files read here) with the
// options `args`. "" with `error` when the spec cannot be read.
std::string submit_request(const std::string& spec, const std::vector<std::string>& args,
                           bool want_outputs, const std::string& out_shown, std::string& error);

// Writes files sent by the supervisor into `dir` (made if missing): false with `error` for
// a path outside it or a failed write.
bool write_task_files(const std::string& dir, capnp::List<schema::TaskFile>::Reader files,
                      std::string& error);

// "error: no answer from the supervisor at ..." with a newline.
std::string no_answer_message(const cluster_client_options& client, bool heard);

}  // namespace maxkernel::cli
