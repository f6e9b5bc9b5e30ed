#include "cli/jaxbench_export.hpp"

#include "messages/capnp_io.hpp"
#include "messages/version.hpp"
#include "tpu_nodes/worker_options.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

extern char** environ;

namespace maxkernel::cli {

namespace fs = std::filesystem;

namespace {

// Importing JAX and tracing the kernel takes seconds; a kernel module that hangs at import
// must not hang the command.
constexpr auto export_timeout = std::chrono::seconds(300);

bool write_file(const fs::path& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
  return static_cast<bool>(f.flush());
}

std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// The exporter's reason: the last "export: ..." line of its stderr, else its last line.
std::string reason(const std::string& err) {
  std::string last, marked;
  std::istringstream lines(err);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    last = line;
    if (line.rfind("export: ", 0) == 0 && line.rfind("export: note:", 0) != 0)
      marked = line.substr(8);
  }
  return marked.empty() ? last : marked;
}

// A private directory removed when the export ends.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& root) {
    std::string tmpl = (fs::path(root) / "maxkernel-export-XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()))
      path = buf.data();
  }
  ~temp_dir() {
    std::error_code ec;
    if (!path.empty())
      fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

}  // namespace

bool export_jaxbench_kernel(schema::KernelSpec::Reader spec, const std::string& kernel_source,
                            std::string& out_source, std::string& error) {
  auto opts = tpu_nodes::worker_options::defaults();
  temp_dir dir(opts.work_root);
  if (dir.path.empty()) {
    error = fmt::format("cannot make a temporary directory in {}: {}", opts.work_root,
                        std::strerror(errno));
    return false;
  }
  auto spec_path = dir.path / "spec.bin", kernel_path = dir.path / "kernel.py",
       out_path = dir.path / "exported.py", err_path = dir.path / "stderr.txt";
  if (!write_file(spec_path, messages::encode_root(spec)) ||
      !write_file(kernel_path, kernel_source)) {
    error = fmt::format("cannot write to {}", dir.path.string());
    return false;
  }

  // The environment: ours, with the worker package first on PYTHONPATH and JAX on the CPU
  // (only eval_shape runs: no device is needed).
  std::vector<std::string> env;
  std::string python_path = opts.package_dir;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("PYTHONPATH=", 0) == 0) {
      if (kv.size() > 11)
        python_path += ":" + kv.substr(11);
      continue;
    }
    if (kv.rfind("JAX_PLATFORMS=", 0) == 0)
      continue;
    env.push_back(std::move(kv));
  }
  env.push_back("PYTHONPATH=" + python_path);
  env.push_back("JAX_PLATFORMS=cpu");
  std::vector<std::string> args = {opts.python,          "-m",
                                   "maxkernel_worker.export", "--spec",
                                   spec_path.string(),   "--kernel",
                                   kernel_path.string(), "--out",
                                   out_path.string(),    "--schema-dir",
                                   opts.schema_dir};
  std::vector<char*> argv, envp;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, opts.python.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    error = fmt::format("cannot run {}: {} (set MAXKERNEL_PYTHON to the venv's python)",
                        opts.python, std::strerror(rc));
    return false;
  }
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + export_timeout;
  for (;;) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid)
      break;
    if (done < 0 && errno != EINTR) {
      error = fmt::format("waiting for the exporter: {}", std::strerror(errno));
      return false;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      error = fmt::format("the exporter did not finish within {} s",
                          std::chrono::seconds(export_timeout).count());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string why = reason(read_file(err_path));
    error = why.empty() ? fmt::format("the exporter failed ({})",
                                      WIFEXITED(status)
                                        ? fmt::format("exit code {}", WEXITSTATUS(status))
                                        : fmt::format("signal {}", WTERMSIG(status)))
                        : why;
    return false;
  }
  std::error_code ec;
  if (!fs::is_regular_file(out_path, ec)) {
    error = "the exporter wrote no module";
    return false;
  }
  out_source = read_file(out_path);
  return true;
}

}  // namespace maxkernel::cli
