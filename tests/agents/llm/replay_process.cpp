#include "tests/agents/llm/replay_process.hpp"

#include <arpa/inet.h>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace maxkernel::tests {

replay_process::replay_process(const std::string& exchanges) {
  std::string file = std::string(MAXKERNEL_LLM_EXCHANGES_DIR) + "/" + exchanges;
  char log_template[] = "/tmp/maxkernel-replay-XXXXXX";
  int log_fd = mkstemp(log_template);
  if (log_fd < 0) {
    error_ = "mkstemp failed";
    return;
  }
  close(log_fd);
  log_path_ = log_template;

  int out_pipe[2], in_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(in_pipe, O_CLOEXEC) != 0) {
    error_ = "pipe failed";
    return;
  }
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(in_pipe[0], STDIN_FILENO);
    execl(MAXKERNEL_PYTHON, MAXKERNEL_PYTHON, MAXKERNEL_REPLAY_SERVER, file.c_str(), "--log",
          log_path_.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out_pipe[1]);
  close(in_pipe[0]);
  stdin_fd_ = in_pipe[1];
  if (pid_ < 0) {
    close(out_pipe[0]);
    error_ = "fork failed";
    return;
  }
  // The port, one line, within 20 s (a loaded machine starts Python slowly).
  std::string line;
  pollfd p{out_pipe[0], POLLIN, 0};
  while (line.find('\n') == std::string::npos && poll(&p, 1, 20000) > 0) {
    char buf[64];
    ssize_t n = read(out_pipe[0], buf, sizeof buf);
    if (n <= 0)
      break;
    line.append(buf, static_cast<size_t>(n));
  }
  close(out_pipe[0]);
  port_ = std::atoi(line.c_str());
  if (port_ <= 0)
    error_ = "the replay server did not print its port (got '" + line + "') for " + file;
}

replay_process::~replay_process() {
  if (stdin_fd_ >= 0)
    close(stdin_fd_);  // the server exits when its stdin closes
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (!log_path_.empty())
    unlink(log_path_.c_str());
}

std::string replay_process::base_url() const {
  return "http://127.0.0.1:" + std::to_string(port_) + "/v1";
}

std::vector<nlohmann::json> replay_process::requests() const {
  std::vector<nlohmann::json> out;
  std::ifstream in(log_path_);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty())
      out.push_back(nlohmann::json::parse(line));
  return out;
}

int closed_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0)
      close(fd);
    return 1;  // port 1: nothing listens there either
  }
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

}  // namespace maxkernel::tests
