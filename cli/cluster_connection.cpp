#include "cli/cluster_connection.hpp"

#include "cli/output_file.hpp"
#include "cli/task_path.hpp"
#include "cli/token_file.hpp"
#include "cluster/curve_handshake_watch.hpp"
#include "cluster/secure_transport.hpp"
#include "config/cluster_config.hpp"
#include "config/native_spec_loader.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "messages/capnp_io.hpp"

#include <capnp/message.h>
#include <fmt/format.h>
#include <zmq.hpp>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <random>
#include <sstream>

namespace maxkernel::cli {

namespace fs = std::filesystem;

namespace {

// The task's files: the spec file, or every file of its directory (hidden files and
// __pycache__ left out), with paths relative to the task.
std::vector<std::pair<std::string, std::string>> task_files(const fs::path& spec, bool& is_dir) {
  std::vector<std::pair<std::string, std::string>> files;
  std::error_code ec;
  is_dir = fs::is_directory(spec, ec);
  if (!is_dir) {
    files.emplace_back(spec.filename().string(), read_whole_file(spec));
    // A native spec's baseline kernel (`baseline: baselines/x.py`) travels beside it, at the
    // same path relative to the spec; one outside the spec's directory cannot (the
    // supervisor refuses paths that leave the task) and is reported there.
    capnp::MallocMessageBuilder msg;
    config::spec_load_options opts;
    opts.memory_limit_bytes = UINT64_MAX;  // the supervisor judges the size
    config::spec_error err;
    if (config::load_native_spec(spec.string(), opts, msg.initRoot<schema::KernelSpec>(), err)) {
      fs::path baseline = msg.getRoot<schema::KernelSpec>().getBaselinePath().cStr();
      auto rel = baseline.empty() ? fs::path() : baseline.lexically_relative(
                                                   fs::absolute(spec, ec).parent_path());
      if (!rel.empty() && *rel.begin() != ".." && fs::is_regular_file(baseline, ec))
        files.emplace_back(rel.string(), read_whole_file(baseline));
    }
    return files;
  }
  for (auto it = fs::recursive_directory_iterator(spec, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    auto name = it->path().filename().string();
    if (!name.empty() && (name[0] == '.' || name == "__pycache__")) {
      if (it->is_directory(ec))
        it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec))
      files.emplace_back(fs::relative(it->path(), spec, ec).string(), read_whole_file(it->path()));
  }
  return files;
}

std::string request_bytes(const std::function<void(schema::ClientRequest::Builder)>& fill) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::ClientRequest>();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  fill(r);
  return messages::encode(msg);
}

std::string random_identity() {
  std::random_device rd;
  return fmt::format("client-{:08x}{:08x}", rd(), rd());
}

}  // namespace

struct cluster_connection::impl {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
};

cluster_connection::cluster_connection() : impl_(std::make_unique<impl>()) {}
cluster_connection::~cluster_connection() = default;

int cluster_connection::open(const cluster_client_options& client, std::ostream& err) {
  std::string host, error;
  uint16_t port = 0;
  if (!config::parse_host_port(client.endpoint, host, port, error) || port == 0) {
    err << "error: --cluster " << client.endpoint << ": "
        << (error.empty() ? "a port is needed" : error) << "\n";
    return 2;
  }
  auto& socket = impl_->socket;
  try {
    std::unique_ptr<cluster::curve_handshake_watch> watch;
    if (!client.token_file.empty()) {
      int code = 0;
      auto creds = load_token_file(client.token_file, err, code);
      if (!creds)
        return code;
      cluster::make_curve_client(socket, *creds);
      watch = std::make_unique<cluster::curve_handshake_watch>(impl_->context, socket);
    }
    socket.set(zmq::sockopt::linger, 0);
    // A fixed identity: a supervisor restarted with --resume sends the run's words to it
    // again, and the socket reconnects by itself.
    socket.set(zmq::sockopt::routing_id, random_identity());
    socket.connect(fmt::format("tcp://{}:{}",
                               host.find(':') != std::string::npos ? "[" + host + "]" : host, port));
    if (watch) {
      // A refusal is known at once; a supervisor not up yet is the caller's silence timeout.
      auto verdict = watch->wait(std::chrono::seconds(5));
      if (verdict.what == cluster::curve_handshake_watch::outcome::refused) {
        err << "error: " << client.endpoint << ": " << verdict.message << "\n";
        return 3;
      }
    }
  } catch (const zmq::error_t& e) {
    err << "error: --cluster " << client.endpoint << ": " << e.what() << "\n";
    return 2;
  }
  return 0;
}

// A signal (Ctrl-C, which the client handles) interrupts ZeroMQ's calls with EINTR: the
// send is made again, the receive comes back empty-handed and the caller asks again.
void cluster_connection::send(const std::string& bytes) {
  for (;;) {
    try {
      impl_->socket.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
      return;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR)
        throw;
    }
  }
}

std::optional<std::string> cluster_connection::receive(std::chrono::milliseconds timeout) {
  try {
    zmq::pollitem_t items[] = {{impl_->socket.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, timeout);
    zmq::message_t frame;
    if (!impl_->socket.recv(frame, zmq::recv_flags::dontwait))
      return std::nullopt;
    return frame.to_string();
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR)
      throw;
    return std::nullopt;
  }
}

std::string command_request(const std::vector<std::string>& words) {
  return request_bytes([&](schema::ClientRequest::Builder r) {
    auto list = r.initCommand(static_cast<unsigned>(words.size()));
    for (unsigned i = 0; i < words.size(); ++i)
      list.set(i, words[i]);
  });
}

std::string status_request() {
  return request_bytes([](schema::ClientRequest::Builder r) { r.setStatus(); });
}

std::string submit_request(const std::string& spec, const std::vector<std::string>& args,
                           bool want_outputs, const std::string& out_shown, std::string& error) {
  std::error_code ec;
  if (!fs::exists(spec, ec)) {
    error = spec + ": no such file or directory";
    return {};
  }
  bool is_dir = false;
  auto files = task_files(fs::path(spec), is_dir);
  auto normal = fs::path(spec).lexically_normal();
  auto name = normal.filename().string();
  if (name.empty())
    name = normal.parent_path().filename().string();
  return request_bytes([&](schema::ClientRequest::Builder r) {
    auto s = r.initSubmit();
    s.setCommand("optimize");
    auto list = s.initArgs(static_cast<unsigned>(args.size()));
    for (unsigned i = 0; i < args.size(); ++i)
      list.set(i, args[i]);
    s.setSpecName(name);
    s.setSpecIsDirectory(is_dir);
    s.setWantOutputs(want_outputs);
    s.setOutShown(out_shown);
    auto fl = s.initFiles(static_cast<unsigned>(files.size()));
    for (unsigned i = 0; i < files.size(); ++i) {
      fl[i].setPath(files[i].first);
      fl[i].setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(files[i].second.data()),
                                 files[i].second.size()));
    }
  });
}

bool write_task_files(const std::string& dir, capnp::List<schema::TaskFile>::Reader files,
                      std::string& error) {
  if (!make_output_dir(dir, error))
    return false;
  for (auto f : files) {
    std::string path = f.getPath().cStr();
    if (!inside_task(path)) {
      error = "the supervisor sent a file outside the directory: " + path;
      return false;
    }
    auto target = fs::path(dir) / path;
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    auto data = f.getData();
    if (!write_output(target.string(), std::string(reinterpret_cast<const char*>(data.begin()), data.size()),
                      error))
      return false;
  }
  return true;
}

std::string no_answer_message(const cluster_client_options& client, bool heard) {
  return "error: no answer from the supervisor at " + client.endpoint + (heard ? " any more" : "")
         + (client.token_file.empty() ? "" : " (not running, or authentication failed)") + "\n";
}

}  // namespace maxkernel::cli
