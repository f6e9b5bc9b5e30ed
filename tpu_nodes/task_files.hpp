// Task directories shipped with the work (docs/cluster.md). A JAXBench or MaxKernel task is
// Python in a directory that a node's worker reads from spec.sourcePath. In a cluster the
// supervisor's copy of it is on another machine, so the supervisor puts the directory's files
// into the spec (KernelSpec.taskFiles) and into the load (LoadRequest.taskFiles); a node
// writes them once per content into a private directory of its own and hands its workers
// specs whose sourcePath names that directory. Store keys are computed before that rewrite,
// so they are the supervisor's.
#pragma once

#include "maxkernel/schema/kernel_spec.capnp.h"

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace maxkernel::tpu_nodes {

// What a node accepts from one shipment: a hostile supervisor (or a bug) must not fill its disk.
struct task_file_limits {
  size_t max_files = 10'000;
  uint64_t max_bytes = 256ull << 20;  // as a submission's files (cli/client_request.hpp)
  size_t max_path = 1'024;            // bytes of one relative path
  size_t max_depth = 32;              // directories above a file
};

// Whether `path` names a file inside a task directory: relative, no empty, "." or ".." part,
// no NUL, no backslash. False with `why`.
bool valid_task_path(std::string_view path, const task_file_limits& limits, std::string& why);

// Hex sha256 over the files in path order (each path and data length-prefixed): the same
// files in any order give the same hash.
std::string task_files_hash(capnp::List<schema::TaskFile>::Reader files);

// The directories one node process wrote, one per content hash, in a 0700 directory of its
// own (under $TMPDIR, else /tmp; never under the node's state directory, which its workers
// do not see), removed when this is destroyed. Thread-safe: the devices of a node process
// share one.
class task_files {
public:
  // `parent`: where the process's directory goes ("" : $TMPDIR, else /tmp).
  explicit task_files(std::string parent = {}, task_file_limits limits = {});
  ~task_files();
  task_files(const task_files&) = delete;
  task_files& operator=(const task_files&) = delete;

  // The directory holding `files`, written the first time these contents arrive under this
  // `name` (the original directory's name, which the worker names a task after when it has
  // no name of its own; "task" when it is not one safe path component). nullopt with `why`
  // for files refused (a path outside the directory, a duplicate, over a limit) or a write
  // that failed; nothing of a refused shipment stays on disk.
  std::optional<std::string> materialize(capnp::List<schema::TaskFile>::Reader files,
                                         std::string_view name, std::string& why);
  // The process's directory ("" until the first materialize).
  std::string root() const;
  // Shipments written so far (distinct contents).
  size_t written() const;

private:
  bool make_root(std::string& why);
  std::string parent_;
  task_file_limits limits_;
  mutable std::mutex mutex_;
  std::string root_;
  std::unordered_map<std::string, std::string> dirs_;  // content hash -> directory
};

// The spec a worker of this node reads: sourcePath `dir`, a baselinePath inside the shipped
// directory moved into `dir`, taskFiles dropped (the worker reads the directory).
void localize_spec(schema::KernelSpec::Builder spec, const std::string& dir);

// A spec loaded from `dir` as its requester names it: sourcePath `original`, and paths inside
// `dir` (baselinePath) inside `original`.
void restore_spec_paths(schema::KernelSpec::Builder spec, const std::string& dir,
                        const std::string& original);

}  // namespace maxkernel::tpu_nodes
