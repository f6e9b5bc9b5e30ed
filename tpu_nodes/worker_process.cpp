#include "tpu_nodes/worker_process.hpp"

#include "tpu_nodes/oom_kill_log.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace maxkernel::tpu_nodes {

namespace fs = std::filesystem;

namespace {

// The pids cgroup the worker made for itself (sandbox.py: a child of the cgroup it was
// started in, which is ours, named maxkernel-worker-PID); empty when there is none.
std::string worker_cgroup(pid_t pid) {
  std::ifstream in("/proc/self/cgroup");
  std::string line, unified;
  while (std::getline(in, line)) {
    auto first = line.find(':');
    auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos)
      continue;
    std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    std::string name = "/maxkernel-worker-" + std::to_string(pid);
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "pids")
        return "/sys/fs/cgroup/pids" + (path == "/" ? "" : path) + name;
    if (controllers.empty())
      unified = "/sys/fs/cgroup" + (path == "/" ? "" : path) + name;
  }
  return unified;
}

// Kills what the worker left in its cgroup (children that left its process group) and
// removes the cgroup.
void remove_worker_cgroup(pid_t pid) {
  std::string dir = worker_cgroup(pid);
  std::error_code ec;
  if (dir.empty() || !fs::exists(dir, ec))
    return;
  for (int round = 0; round < 50; ++round) {
    std::ifstream procs(dir + "/cgroup.procs");
    bool any = false;
    for (long p; procs >> p;) {
      ::kill(static_cast<pid_t>(p), SIGKILL);
      any = true;
    }
    if (!any && ::rmdir(dir.c_str()) == 0)
      return;
    ::usleep(10'000);
  }
}

}  // namespace

worker_process::worker_process(worker_options opts) : opts_(std::move(opts)) {
}

worker_process::~worker_process() {
  kill();
  if (!workdir_.empty()) {
    std::error_code ec;
    fs::remove_all(workdir_, ec);
  }
}

bool worker_process::start(std::string& error) {
  kill();
  if (workdir_.empty()) {
    std::string pattern = (fs::path(opts_.work_root) / "maxkernel-worker-XXXXXX").string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) {
      error = "cannot create a working directory under " + opts_.work_root + ": "
              + std::strerror(errno);
      return false;
    }
    workdir_ = buf.data();
  }
  endpoint_ = "ipc://" + workdir_ + "/worker.sock";
  std::error_code ec;
  fs::remove(workdir_ + "/worker.sock", ec);
  if (!fs::exists(opts_.python)) {
    error = "the worker's Python interpreter " + opts_.python
            + " does not exist (run scripts/setup)";
    return false;
  }

  // Everything the child needs is prepared before fork: only async-signal-safe calls after.
  std::vector<std::string> args = {opts_.python, "-m", "maxkernel_worker", "--endpoint", endpoint_,
                                   "--schema-dir", opts_.schema_dir, "--workdir", workdir_};
  if (opts_.memory_limit_bytes > 0) {
    args.push_back("--memory-limit");
    args.push_back(std::to_string(opts_.memory_limit_bytes));
  }
  for (const auto& path : opts_.hide) {
    args.push_back("--hide");
    args.push_back(path);
  }
  if (!opts_.sandbox)
    args.push_back("--no-sandbox");
  // A clean environment: nothing of the caller's (credentials, proxies) reaches candidates.
  std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
                                  "HOME=" + workdir_, "TMPDIR=" + workdir_,
                                  "PYTHONPATH=" + opts_.package_dir,
                                  "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"};
  for (const char* keep : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"})
    if (const char* v = std::getenv(keep))
      env.push_back(std::string(keep) + "=" + v);
  for (auto& [k, v] : opts_.extra_env)
    env.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string log_path = workdir_ + "/worker.log";
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd < 0) {
    error = "cannot open " + log_path + ": " + std::strerror(errno);
    return false;
  }
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);

  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    error = std::string("fork failed: ") + std::strerror(errno);
    ::close(log_fd);
    if (devnull >= 0)
      ::close(devnull);
    return false;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    // The worker dies with its parent, however the parent ends (SIGKILL included): no
    // orphaned JAX processes.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent)
      ::_exit(125);
    if (devnull >= 0)
      ::dup2(devnull, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    if (::chdir(workdir_.c_str()) != 0)
      ::_exit(126);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so kill() never races the child's setpgid
  ::close(log_fd);
  if (devnull >= 0)
    ::close(devnull);
  pid_ = pid;
  exit_description_.clear();
  oom_killed_ = false;
  return true;
}

void worker_process::kill() {
  if (pid_ <= 0)
    return;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  if (exit_description_.empty())
    exit_description_ = "killed";
  remove_worker_cgroup(pid_);
  pid_ = -1;
}

bool worker_process::alive() {
  if (pid_ <= 0)
    return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0)
    return true;
  if (r == pid_) {
    if (WIFEXITED(status))
      exit_description_ = "exit code " + std::to_string(WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
      exit_description_ = std::string("signal ") + std::to_string(WTERMSIG(status)) + " ("
                          + strsignal(WTERMSIG(status)) + ")";
    oom_killed_ = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && killed_by_oom_killer(pid_);
    if (oom_killed_)
      exit_description_ += ", sent by the kernel's out-of-memory killer";
    ::kill(-pid_, SIGKILL);  // anything the worker left behind in its group
    remove_worker_cgroup(pid_);
    pid_ = -1;
  }
  return false;
}

std::string worker_process::log_tail(size_t max_bytes) const {
  std::ifstream in(workdir_ + "/worker.log", std::ios::binary);
  if (!in)
    return {};
  std::stringstream ss;
  ss << in.rdbuf();
  auto text = ss.str();
  if (text.size() > max_bytes)
    text = "..." + text.substr(text.size() - max_bytes);
  return text;
}

}  // namespace maxkernel::tpu_nodes
