#include "tpu_nodes/task_files.hpp"

#include "messages/content_hash.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_set>
#include <vector>

namespace maxkernel::tpu_nodes {

namespace fs = std::filesystem;

bool valid_task_path(std::string_view path, const task_file_limits& limits, std::string& why) {
  auto refuse = [&](const std::string& what) {
    why = "'" + std::string(path.substr(0, 200)) + "' " + what;
    return false;
  };
  if (path.empty())
    return refuse("is empty");
  if (path.size() > limits.max_path)
    return refuse("is longer than " + std::to_string(limits.max_path) + " bytes");
  if (path.front() == '/')
    return refuse("is absolute");
  if (path.find('\0') != std::string_view::npos)
    return refuse("holds a NUL byte");
  if (path.find('\\') != std::string_view::npos)
    return refuse("holds a backslash");
  size_t depth = 0;
  size_t start = 0;
  while (true) {
    auto end = path.find('/', start);
    auto part = path.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (part.empty() || part == "." || part == "..")
      return refuse("is not a path inside the task (an empty, '.' or '..' part)");
    if (end == std::string_view::npos)
      break;
    if (++depth > limits.max_depth)
      return refuse("is deeper than " + std::to_string(limits.max_depth) + " directories");
    start = end + 1;
  }
  return true;
}

namespace {

std::string_view text_of(capnp::Text::Reader t) { return {t.begin(), t.size()}; }

std::string_view bytes_of(capnp::Data::Reader d) {
  return {reinterpret_cast<const char*>(d.begin()), d.size()};
}

std::vector<unsigned> path_order(capnp::List<schema::TaskFile>::Reader files) {
  std::vector<unsigned> order(files.size());
  for (unsigned i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](unsigned a, unsigned b) {
    return text_of(files[a].getPath()) < text_of(files[b].getPath());
  });
  return order;
}

// Every shipped path valid, none twice, none both a file and a directory, within the limits.
bool check_files(capnp::List<schema::TaskFile>::Reader files, const task_file_limits& limits,
                 std::string& why) {
  if (files.size() > limits.max_files) {
    why = std::to_string(files.size()) + " files; a node takes at most "
          + std::to_string(limits.max_files);
    return false;
  }
  uint64_t total = 0;
  std::unordered_set<std::string_view> paths, dirs;
  for (auto f : files) {
    auto path = text_of(f.getPath());
    if (!valid_task_path(path, limits, why))
      return false;
    if (!paths.insert(path).second) {
      why = "'" + std::string(path) + "' is sent twice";
      return false;
    }
    for (auto slash = path.find('/'); slash != std::string_view::npos; slash = path.find('/', slash + 1))
      dirs.insert(path.substr(0, slash));
    total += f.getData().size();
    if (total > limits.max_bytes) {
      why = "the files take more than " + std::to_string(limits.max_bytes) + " bytes";
      return false;
    }
  }
  for (auto d : dirs)
    if (paths.count(d)) {
      why = "'" + std::string(d) + "' is sent both as a file and as a directory";
      return false;
    }
  return true;
}

// A directory name that is one safe path component: the task's own name when it is one (the
// worker names a task without a name of its own after its directory), else "task".
std::string directory_name(std::string_view name) {
  std::string out(name.substr(0, 128));
  if (out.empty() || out == "." || out == ".." || out.find_first_of("/\\") != std::string::npos
      || out.find('\0') != std::string::npos)
    return "task";
  return out;
}

std::string errno_text(int e) { return std::strerror(e); }

// mkdir for a directory only this process made: an existing one must be a real directory.
bool make_dir(const std::string& path, std::string& why) {
  if (::mkdir(path.c_str(), 0700) == 0)
    return true;
  int e = errno;
  struct stat st {};
  if (e == EEXIST && ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return true;
  why = "cannot make " + path + ": " + errno_text(e);
  return false;
}

bool write_file(const std::string& path, std::string_view data, std::string& why) {
  // O_EXCL | O_NOFOLLOW: never through a link, never over a file written before.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = "cannot write " + path + ": " + errno_text(errno);
    return false;
  }
  while (!data.empty()) {
    auto n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      why = "cannot write " + path + ": " + errno_text(errno);
      ::close(fd);
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  if (::close(fd) != 0) {
    why = "cannot write " + path + ": " + errno_text(errno);
    return false;
  }
  return true;
}

bool write_files(const std::string& dir, capnp::List<schema::TaskFile>::Reader files,
                 std::string& why) {
  if (!make_dir(dir, why))
    return false;
  for (auto i : path_order(files)) {
    std::string path(text_of(files[i].getPath()));
    // Its directories, outermost first (sorted order does not guarantee they exist yet).
    for (auto slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1))
      if (!make_dir(dir + "/" + path.substr(0, slash), why))
        return false;
    if (!write_file(dir + "/" + path, bytes_of(files[i].getData()), why))
      return false;
  }
  return true;
}

}  // namespace

std::string task_files_hash(capnp::List<schema::TaskFile>::Reader files) {
  std::string bytes;
  size_t size = 0;
  for (auto f : files)
    size += f.getPath().size() + f.getData().size() + 42;
  bytes.reserve(size);
  for (auto i : path_order(files)) {
    auto path = text_of(files[i].getPath());
    auto data = bytes_of(files[i].getData());
    bytes += std::to_string(path.size());
    bytes += ':';
    bytes += path;
    bytes += std::to_string(data.size());
    bytes += ':';
    bytes += data;
  }
  return messages::sha256_hex(bytes);
}

task_files::task_files(std::string parent, task_file_limits limits)
    : parent_(std::move(parent)), limits_(limits) {}

task_files::~task_files() {
  std::lock_guard lock(mutex_);
  if (!root_.empty()) {
    std::error_code ec;
    fs::remove_all(root_, ec);  // remove_all does not follow links
  }
}

bool task_files::make_root(std::string& why) {
  if (!root_.empty())
    return true;
  std::string parent = parent_;
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp && *tmp ? tmp : "/tmp";
  }
  std::string pattern = parent + "/maxkernel-tasks-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) {  // mode 0700
    why = "cannot make a directory for shipped tasks in " + parent + ": " + errno_text(errno);
    return false;
  }
  root_ = buf.data();
  return true;
}

std::optional<std::string> task_files::materialize(capnp::List<schema::TaskFile>::Reader files,
                                                   std::string_view name, std::string& why) {
  if (!check_files(files, limits_, why)) {
    why = "the task's files: " + why;
    return std::nullopt;
  }
  auto hash = task_files_hash(files);
  auto dir_name = directory_name(name);
  auto key = hash + "/" + dir_name;
  std::lock_guard lock(mutex_);
  std::error_code ec;
  if (auto it = dirs_.find(key); it != dirs_.end()) {
    if (fs::is_directory(it->second, ec))
      return it->second;
    dirs_.erase(it);  // removed behind our back: write it again
  }
  if (!make_root(why))
    return std::nullopt;
  auto outer = root_ + "/" + hash.substr(0, 24);
  auto dir = outer + "/" + dir_name;
  fs::remove_all(dir, ec);  // a write that failed half-way
  if (!make_dir(outer, why) || !write_files(dir, files, why)) {
    fs::remove_all(dir, ec);
    return std::nullopt;
  }
  dirs_.emplace(key, dir);
  return dir;
}

std::string task_files::root() const {
  std::lock_guard lock(mutex_);
  return root_;
}

size_t task_files::written() const {
  std::lock_guard lock(mutex_);
  return dirs_.size();
}

namespace {

// `path` with the directory `from` at its start replaced by `to`; unchanged when it is not
// inside `from`.
std::string moved(std::string_view path, std::string_view from, std::string_view to) {
  if (from.empty() || path.substr(0, from.size()) != from)
    return std::string(path);
  auto rest = path.substr(from.size());
  if (!rest.empty() && rest.front() != '/')
    return std::string(path);  // /a/bc is not inside /a/b
  return std::string(to) + std::string(rest);
}

}  // namespace

void localize_spec(schema::KernelSpec::Builder spec, const std::string& dir) {
  auto in = spec.asReader();
  std::string source = in.getSourcePath().cStr();
  spec.setBaselinePath(moved(text_of(in.getBaselinePath()), source, dir));
  spec.setSourcePath(dir);
  spec.disownTaskFiles();
}

void restore_spec_paths(schema::KernelSpec::Builder spec, const std::string& dir,
                        const std::string& original) {
  auto in = spec.asReader();
  auto baseline = moved(text_of(in.getBaselinePath()), dir, original);
  auto source = moved(text_of(in.getSourcePath()), dir, original);
  spec.setBaselinePath(baseline);
  spec.setSourcePath(source);
}

}  // namespace maxkernel::tpu_nodes
