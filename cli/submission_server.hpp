// A cluster supervisor's client port (docs/cluster.md): a ZeroMQ ROUTER where `maxkernel
// optimize --cluster` submits a task and its options (messages/schema/submission.capnp).
// Each submission runs the same search as an embedded `optimize` (cli/optimize_run) on the
// supervisor's session, whose evaluations go to the cluster's nodes; what it prints is
// streamed back and, at the end, the files it wrote. Behind CURVE when the cluster has
// credentials: a client without them never gets a frame through.
#pragma once

#include "cli/node_session.hpp"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace maxkernel::cli {

struct submission_server_config {
  std::string endpoint;    // tcp://HOST:PORT (port * : any free port)
  std::string state_dir;   // the evaluation store, search graphs and submissions/
  std::string token_file;  // "": no CURVE
  // Runs the submissions a killed supervisor left unfinished again (with --resume: nothing
  // that finished is evaluated again), for the clients that sent them.
  bool resume = false;
  std::string node_endpoint;  // HOST:PORT nodes join at (what `scale` tells)
};

class submission_server {
public:
  submission_server(node_session& session, submission_server_config config);
  ~submission_server();
  submission_server(const submission_server&) = delete;
  submission_server& operator=(const submission_server&) = delete;

  // Binds the socket; false with `error` (exit code 2: a bad endpoint or a port in use).
  bool bind(std::string& error);
  const std::string& endpoint() const { return endpoint_; }
  // Serves until `stop` turns true; then tells the clients of the submissions still running
  // that they are left for --resume, and returns.
  void serve(const std::atomic<bool>& stop);
  // Submissions still running: their searches cannot be cut short cleanly, so a supervisor
  // that stops with any ends its process as a kill would (their state is in the store and
  // the search graphs, which --resume continues from).
  size_t unfinished() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::string endpoint_;
};

}  // namespace maxkernel::cli
