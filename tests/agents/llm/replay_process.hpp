// Starts tests/support/replay_server.py on a recorded exchange file and reads back what the
// client sent. The server binds a free loopback port and exits when this object goes away.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <sys/types.h>
#include <vector>

namespace maxkernel::tests {

class replay_process {
public:
  // `exchanges`: a file name under tests/agents/llm/exchanges/.
  explicit replay_process(const std::string& exchanges);
  ~replay_process();
  replay_process(const replay_process&) = delete;
  replay_process& operator=(const replay_process&) = delete;

  bool started() const { return port_ > 0; }
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  std::string base_url() const;  // http://127.0.0.1:PORT/v1

  // The requests received so far, in order (index, method, path, headers, body, mismatch).
  std::vector<nlohmann::json> requests() const;

private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int port_ = 0;
  std::string log_path_;
  std::string error_;
};

// A loopback port nothing listens on (bound, then closed).
int closed_port();

}  // namespace maxkernel::tests
