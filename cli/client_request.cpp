#include "cli/client_request.hpp"

#include "cli/task_path.hpp"
#include "maxkernel/schema/common.capnp.h"

#include <fmt/format.h>
#include <kj/exception.h>

namespace maxkernel::cli {

std::optional<messages::decoded_message> read_client_request(const std::string& bytes,
                                                             std::string& why) {
  std::string error;
  auto msg = messages::decoded_message::parse(bytes, error);
  if (!msg) {
    why = "malformed request: " + error;
    return std::nullopt;
  }
  try {
    auto req = msg->root<schema::ClientRequest>();
    if (req.getSchemaVersion() != schema::SCHEMA_VERSION) {
      why = fmt::format("schema version {}; this supervisor reads {}", req.getSchemaVersion(),
                        schema::SCHEMA_VERSION);
      return std::nullopt;
    }
  } catch (const kj::Exception& e) {
    why = std::string("malformed request: ") + e.getDescription().cStr();
    return std::nullopt;
  }
  // Every pointer now, so that reading a field later cannot throw halfway through a run.
  if (!messages::check_traversal(*msg, capnp::Schema::from<schema::ClientRequest>(), error)) {
    why = "malformed request: " + error;
    return std::nullopt;
  }
  msg->allow_rereading();  // as messages::decode: the reads that follow cannot throw
  return msg;
}

bool check_submission(schema::Submission::Reader sub, std::string& why) {
  if (std::string(sub.getCommand().cStr()) != "optimize") {
    why = fmt::format("unknown command '{}': a cluster runs optimize", sub.getCommand().cStr());
    return false;
  }
  std::string name = sub.getSpecName().cStr();
  if (!inside_task(name) || name.find('/') != std::string::npos) {
    why = "specName: a file or directory name, got '" + name + "'";
    return false;
  }
  uint64_t total = 0;
  for (auto f : sub.getFiles()) {
    if (!inside_task(f.getPath().cStr())) {
      why = fmt::format("files: '{}' is not a path inside the task", f.getPath().cStr());
      return false;
    }
    total += f.getData().size();
  }
  if (total > max_task_bytes) {
    why = fmt::format("the task's files take {} bytes; at most {}", total, max_task_bytes);
    return false;
  }
  return true;
}

}  // namespace maxkernel::cli
