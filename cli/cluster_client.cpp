#include "cli/cluster_client.hpp"

#include "cli/operator_console.hpp"
#include "cli/output_file.hpp"
#include "cluster/cluster_credentials.hpp"
#include "cluster/secure_transport.hpp"
#include "config/cluster_config.hpp"
#include "maxkernel/schema/common.capnp.h"
#include "maxkernel/schema/submission.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/payload_codec.hpp"

#include <capnp/message.h>
#include <fmt/format.h>
#include <zmq.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

namespace maxkernel::cli {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream data;
  data << in.rdbuf();
  return data.str();
}

// The task's files: the spec file, or every file of its directory (hidden files and
// __pycache__ left out), with paths relative to the task.
std::vector<std::pair<std::string, std::string>> task_files(const fs::path& spec, bool& is_dir) {
  std::vector<std::pair<std::string, std::string>> files;
  std::error_code ec;
  is_dir = fs::is_directory(spec, ec);
  if (!is_dir) {
    files.emplace_back(spec.filename().string(), read_file(spec));
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
      files.emplace_back(fs::relative(it->path(), spec, ec).string(), read_file(it->path()));
  }
  return files;
}

std::string random_identity() {
  std::random_device rd;
  return fmt::format("client-{:08x}{:08x}", rd(), rd());
}

std::string request_bytes(const std::function<void(schema::ClientRequest::Builder)>& fill) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::ClientRequest>();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  fill(r);
  return messages::encode(msg);
}

bool write_outputs(const std::string& dir, schema::RunFinished::Reader finished,
                   std::string& error) {
  if (!make_output_dir(dir, error))
    return false;
  for (auto f : finished.getFiles()) {
    std::string path = f.getPath().cStr();
    if (path.empty() || path.front() == '/' || path.find("..") != std::string::npos) {
      error = "the supervisor sent an output outside the directory: " + path;
      return false;
    }
    auto target = fs::path(dir) / path;
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    auto data = f.getData();
    std::string bytes(reinterpret_cast<const char*>(data.begin()), data.size());
    if (!write_output(target.string(), bytes, error))
      return false;
  }
  return true;
}

// Sets up and connects a DEALER to the supervisor's client port: 0, or the exit code after
// printing why (2: a bad endpoint or credentials file).
int connect_client(zmq::socket_t& socket, const cluster_client_options& client) {
  std::string host, error;
  uint16_t port = 0;
  if (!config::parse_host_port(client.endpoint, host, port, error) || port == 0) {
    std::cerr << "error: --cluster " << client.endpoint << ": "
              << (error.empty() ? "a port is needed" : error) << "\n";
    return 2;
  }
  if (!client.token_file.empty()) {
    auto creds = cluster::read_cluster_credentials(client.token_file, error);
    if (!creds) {
      std::cerr << "error: --token-file: " << error << "\n";
      return 2;
    }
    cluster::make_curve_client(socket, *creds);
  }
  socket.set(zmq::sockopt::linger, 0);
  // A fixed identity: a supervisor restarted with --resume sends the run's words to it
  // again, and the socket reconnects by itself.
  socket.set(zmq::sockopt::routing_id, random_identity());
  socket.connect(fmt::format("tcp://{}:{}", host.find(':') != std::string::npos ? "[" + host + "]" : host, port));
  return 0;
}

std::string no_answer(const cluster_client_options& client, bool heard) {
  return "error: no answer from the supervisor at " + client.endpoint + (heard ? " any more" : "")
         + (client.token_file.empty() ? "" : " (not running, or authentication failed)") + "\n";
}

}  // namespace

int run_cluster_status(const cluster_client_options& client) {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  try {
    if (int code = connect_client(socket, client))
      return code;
    socket.send(zmq::buffer(request_bytes([](schema::ClientRequest::Builder r) { r.setStatus(); })),
                zmq::send_flags::none);
    zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, std::chrono::milliseconds(static_cast<int64_t>(client.silence_seconds * 1000)));
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) {
      std::cerr << no_answer(client, false);
      return 3;
    }
    std::string error;
    auto msg = messages::decoded_message::parse(frame.to_string(), error);
    if (!msg || msg->root<schema::ClientEvent>().which() != schema::ClientEvent::STATUS) {
      std::cerr << "error: the supervisor sent no status" << (error.empty() ? "" : ": " + error)
                << "\n";
      return 3;
    }
    std::cout << msg->root<schema::ClientEvent>().getStatus().cStr();
    return 0;
  } catch (const zmq::error_t& e) {
    std::cerr << "error: --cluster " << client.endpoint << ": " << e.what() << "\n";
    return 3;
  } catch (const kj::Exception& e) {
    std::cerr << "error: the supervisor sent a malformed event: " << e.getDescription().cStr()
              << "\n";
    return 3;
  }
}

int run_cluster_optimize(const optimize_options& opts, const std::vector<std::string>& args,
                         const cluster_client_options& client) {
  std::string error;
  std::error_code ec;
  if (!fs::exists(opts.spec, ec)) {
    std::cerr << "error: " << opts.spec << ": no such file or directory\n";
    return 2;
  }
  if (!opts.out.empty() && !make_output_dir(opts.out, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (!output_dir_exists(opts.json, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  bool is_dir = false;
  auto files = task_files(fs::path(opts.spec), is_dir);
  auto name = fs::path(opts.spec).lexically_normal().filename().string();
  if (name.empty())
    name = fs::path(opts.spec).lexically_normal().parent_path().filename().string();

  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  try {
    if (int code = connect_client(socket, client))
      return code;
    auto submit = request_bytes([&](schema::ClientRequest::Builder r) {
      auto s = r.initSubmit();
      s.setCommand("optimize");
      auto list = s.initArgs(static_cast<unsigned>(args.size()));
      for (unsigned i = 0; i < args.size(); ++i)
        list.set(i, args[i]);
      s.setSpecName(name);
      s.setSpecIsDirectory(is_dir);
      s.setWantOutputs(!opts.out.empty());
      s.setOutShown(opts.out);
      auto fl = s.initFiles(static_cast<unsigned>(files.size()));
      for (unsigned i = 0; i < files.size(); ++i) {
        fl[i].setPath(files[i].first);
        fl[i].setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(files[i].second.data()),
                                   files[i].second.size()));
      }
    });
    socket.send(zmq::buffer(submit), zmq::send_flags::none);
    auto status = request_bytes([](schema::ClientRequest::Builder r) { r.setStatus(); });
    auto silence = std::chrono::milliseconds(static_cast<int64_t>(client.silence_seconds * 1000));
    auto last_word = std::chrono::steady_clock::now();
    auto last_ping = last_word;
    bool heard = false;
    std::thread console;
    struct joiner {
      std::thread& t;
      ~joiner() {
        if (t.joinable())
          t.detach();  // an error ends the client; the console's reader may still block
      }
    } leave{console};
    for (;;) {
      zmq::message_t frame;
      auto got = socket.recv(frame, zmq::recv_flags::dontwait);
      if (!got) {
        auto now = std::chrono::steady_clock::now();
        if (now - last_word > silence) {
          std::cerr << no_answer(client, heard);
          return 3;
        }
        // The run may print nothing for minutes; a status request shows the supervisor lives.
        if (now - last_ping > silence / 3) {
          socket.send(zmq::buffer(status), zmq::send_flags::dontwait);
          last_ping = now;
        }
        zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 1, std::chrono::milliseconds(200));
        continue;
      }
      heard = true;
      last_word = std::chrono::steady_clock::now();
      auto msg = messages::decoded_message::parse(frame.to_string(), error);
      if (!msg) {
        std::cerr << "error: the supervisor sent a malformed event: " << error << "\n";
        return 3;
      }
      auto e = msg->root<schema::ClientEvent>();
      switch (e.which()) {
        case schema::ClientEvent::OUTPUT: {
          std::string text = e.getOutput().getText().cStr();
          // --console: this terminal attaches to the run's operator gateway, as embedded.
          auto at = text.find("operator gateway: ");
          if (opts.console && !console.joinable() && at != std::string::npos) {
            console_options co;
            co.endpoint = text.substr(at + 18, text.find(' ', at + 18) - at - 18);
            co.token_file = client.token_file;
            co.prompt = ::isatty(STDIN_FILENO) == 1;
            console = std::thread([co] { run_console(co, std::cin, std::cout, std::cerr); });
          }
          auto& stream = e.getOutput().getStream() == 1 ? std::cout : std::cerr;
          if (opts.json == "-" && e.getOutput().getStream() == 1)
            std::cerr << e.getOutput().getText().cStr();  // stdout carries the JSON
          else
            stream << e.getOutput().getText().cStr() << std::flush;
          break;
        }
        case schema::ClientEvent::STATUS:
          break;  // a sign of life
        case schema::ClientEvent::REFUSED:
          std::cerr << "error: the supervisor refused the task: " << e.getRefused().cStr() << "\n";
          return 2;
        case schema::ClientEvent::FINISHED: {
          auto f = e.getFinished();
          if (console.joinable())
            console.join();  // it leaves on the gateway's `ended`
          if (!opts.out.empty() && f.getFiles().size() > 0 && !write_outputs(opts.out, f, error)) {
            std::cerr << "error: " << error << "\n";
            return 3;
          }
          if (!opts.json.empty() && f.getJson().size() > 0
              && !write_output(opts.json, f.getJson().cStr(), error)) {
            std::cerr << "error: " << error << "\n";
            return 3;
          }
          return f.getExitCode();
        }
      }
    }
  } catch (const zmq::error_t& e) {
    std::cerr << "error: --cluster " << client.endpoint << ": " << e.what() << "\n";
    return 3;
  } catch (const kj::Exception& e) {
    std::cerr << "error: the supervisor sent a malformed event: " << e.getDescription().cStr()
              << "\n";
    return 3;
  }
}

}  // namespace maxkernel::cli
