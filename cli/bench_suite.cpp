#include "cli/bench_suite.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

namespace maxkernel::cli {

namespace fs = std::filesystem;

namespace {

spec_kind kind_of_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "baseline.py", ec))
    return spec_kind::jaxbench;
  if (fs::exists(dir / "kernel_task.yaml", ec))
    return spec_kind::maxkernel;
  return spec_kind::invalid;
}

bool is_spec_file(const fs::path& p) {
  auto ext = p.extension().string();
  return ext == ".yaml" || ext == ".yml";
}

// Hidden entries and Python caches are never tasks.
bool skipped(const fs::path& p) {
  auto name = p.filename().string();
  return name.empty() || name[0] == '.' || name == "__pycache__";
}

// `globs`: comma-separated; a task is kept when any of them matches its name or path.
bool matches(const std::string& globs, const suite_task& t) {
  if (globs.empty())
    return true;
  size_t start = 0;
  while (start <= globs.size()) {
    size_t comma = globs.find(',', start);
    auto glob = globs.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!glob.empty() && (fnmatch(glob.c_str(), t.name.c_str(), 0) == 0 ||
                          fnmatch(glob.c_str(), t.relative.c_str(), 0) == 0))
      return true;
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  return false;
}

suite_task task_at(const fs::path& root, const fs::path& p, spec_kind kind) {
  suite_task t;
  t.path = p.string();
  auto rel = p.lexically_relative(root);
  if (kind == spec_kind::native)
    rel.replace_extension();
  t.relative = rel.empty() || rel == "." ? p.filename().string() : rel.generic_string();
  t.name = kind == spec_kind::native ? p.stem().string() : p.filename().string();
  t.kind = kind;
  return t;
}

}  // namespace

bool find_suite_tasks(const std::string& suite, const std::string& glob,
                      std::vector<suite_task>& tasks, std::string& error) {
  std::error_code ec;
  fs::path root(suite);
  auto status = fs::status(root, ec);
  if (ec || !fs::exists(status)) {
    error = suite + ": no such file or directory";
    return false;
  }
  std::vector<suite_task> found;
  if (!fs::is_directory(status)) {
    if (!is_spec_file(root)) {
      error = suite + ": a suite is a directory of tasks (or one .yaml spec or task directory)";
      return false;
    }
    found.push_back(task_at(root.parent_path(), root, spec_kind::native));
  } else if (auto kind = kind_of_dir(root); kind != spec_kind::invalid) {
    found.push_back(task_at(root.parent_path(), root, kind));
  } else {
    fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
    if (ec) {
      error = suite + ": " + ec.message();
      return false;
    }
    for (auto end = fs::recursive_directory_iterator(); it != end; it.increment(ec)) {
      if (ec) {
        error = suite + ": " + ec.message();
        return false;
      }
      const auto& p = it->path();
      if (skipped(p)) {
        if (it->is_directory(ec))
          it.disable_recursion_pending();
        continue;
      }
      if (it->is_directory(ec)) {
        if (auto kind = kind_of_dir(p); kind != spec_kind::invalid) {
          found.push_back(task_at(root, p, kind));
          it.disable_recursion_pending();
        }
      } else if (is_spec_file(p)) {
        found.push_back(task_at(root, p, spec_kind::native));
      }
    }
  }
  std::sort(found.begin(), found.end(),
            [](const suite_task& a, const suite_task& b) { return a.relative < b.relative; });
  for (auto& t : found)
    if (matches(glob, t))
      tasks.push_back(std::move(t));
  if (tasks.empty()) {
    error = found.empty() ? suite + ": no tasks (native .yaml specs, JAXBench task directories "
                                    "with baseline.py, MaxKernel task directories with "
                                    "kernel_task.yaml)"
                          : suite + ": no task matches --tasks " + glob;
    return false;
  }
  return true;
}

}  // namespace maxkernel::cli
