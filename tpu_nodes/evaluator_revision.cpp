#include "tpu_nodes/evaluator_revision.hpp"

#include "config/chip_loader.hpp"
#include "messages/content_hash.hpp"
#include "tpu_nodes/worker_options.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#ifndef MAXKERNEL_PRICING_DIGEST
#error "MAXKERNEL_PRICING_DIGEST (tpu_nodes/CMakeLists.txt) is not defined"
#endif

namespace maxkernel::tpu_nodes {

namespace fs = std::filesystem;

namespace {

bool read_file(const fs::path& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return false;
  std::ostringstream text;
  text << in.rdbuf();
  out = text.str();
  return !in.bad();
}

}  // namespace

std::string tree_digest(const std::string& dir, std::string_view suffix) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return "missing";
  std::vector<std::string> files;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && it->path().filename() == "__pycache__") {
      it.disable_recursion_pending();
      continue;
    }
    auto name = it->path().filename().string();
    if (it->is_regular_file(ec) && name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      files.push_back(fs::relative(it->path(), dir, ec).generic_string());
  }
  std::sort(files.begin(), files.end());
  messages::sha256_stream hash;
  for (const auto& f : files) {
    std::string bytes, contents;
    if (!read_file(fs::path(dir) / f, contents))
      contents = "unreadable";
    messages::append_part(bytes, f);
    messages::append_part(bytes, contents);
    hash.update(bytes);
  }
  return hash.hex();
}

std::string file_digest(const std::string& path) {
  std::string contents;
  return read_file(path, contents) ? messages::sha256_hex(contents) : "missing";
}

std::string evaluator_revision_of(std::string_view worker_digest, std::string_view backend,
                                  std::string_view chip_digest) {
  std::string bytes;
  messages::append_part(bytes, "worker");
  messages::append_part(bytes, worker_digest);
  // Only the model prices from the pricing code and the chip file; a measured time does not.
  if (backend == "model") {
    messages::append_part(bytes, "pricing");
    messages::append_part(bytes, MAXKERNEL_PRICING_DIGEST);
    messages::append_part(bytes, "chip");
    messages::append_part(bytes, chip_digest);
  }
  return messages::sha256_hex(bytes);
}

std::string evaluator_revision(std::string_view backend, std::string_view chip) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, std::string, std::less<>> known;
  static std::string worker;  // the package's digest, once
  std::lock_guard lock(mutex);
  auto key = std::make_pair(std::string(backend), std::string(chip));
  if (auto it = known.find(key); it != known.end())
    return it->second;
  if (worker.empty())
    worker = tree_digest(worker_options::defaults().package_dir, ".py");
  std::string chip_digest;
  if (backend == "model")
    chip_digest = file_digest(config::chips_dir() + "/" + std::string(chip) + ".yaml");
  auto revision = evaluator_revision_of(worker, backend, chip_digest);
  known.emplace(std::move(key), revision);
  return revision;
}

}  // namespace maxkernel::tpu_nodes
