#include "cli/submission_server.hpp"

#include "cli/brain_options.hpp"
#include "cli/client_request.hpp"
#include "cli/optimize_cli.hpp"
#include "cli/optimize_run.hpp"
#include "cli/output_file.hpp"
#include "cli/shell_service.hpp"
#include "cli/spec_source.hpp"
#include "cli/task_session.hpp"
#include "cluster/cluster_credentials.hpp"
#include "cluster/secure_transport.hpp"
#include "config/chip_names.hpp"
#include "maxkernel/schema/cluster.capnp.h"
#include "maxkernel/schema/submission.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/payload_codec.hpp"

#include <CLI/CLI.hpp>
#include <capnp/message.h>
#include <fmt/format.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <streambuf>
#include <thread>

namespace maxkernel::cli {

namespace fs = std::filesystem;

namespace {

// Frames waiting for the socket's thread: [client identity, ClientEvent bytes].
class outbox {
public:
  void push(std::string identity, std::string bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    frames_.emplace_back(std::move(identity), std::move(bytes));
  }
  std::deque<std::pair<std::string, std::string>> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(frames_, {});
  }

private:
  std::mutex mutex_;
  std::deque<std::pair<std::string, std::string>> frames_;
};

// False when the client is not connected (the router is mandatory) or its queue is full.
bool send_frame(zmq::socket_t& router, const std::string& identity, const std::string& bytes) {
  try {
    std::array<zmq::const_buffer, 2> out{zmq::buffer(identity), zmq::buffer(bytes)};
    return zmq::send_multipart(router, out, zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    return false;
  }
}

std::string event_bytes(const std::function<void(schema::ClientEvent::Builder)>& fill) {
  capnp::MallocMessageBuilder msg;
  auto e = msg.initRoot<schema::ClientEvent>();
  e.setSchemaVersion(schema::SCHEMA_VERSION);
  fill(e);
  return messages::encode(msg);
}

// What a submission prints, line by line (or at a flush) to its client.
class client_stream : public std::streambuf {
public:
  client_stream(outbox& box, std::string identity, uint8_t stream, std::ofstream& log)
    : box_(box), identity_(std::move(identity)), stream_(stream), log_(log) {}
  ~client_stream() override { sync(); }

protected:
  int_type overflow(int_type c) override {
    if (c == traits_type::eof())
      return traits_type::not_eof(c);
    text_.push_back(static_cast<char>(c));
    if (c == '\n' || c == '\r')
      sync();
    return c;
  }
  int sync() override {
    if (text_.empty())
      return 0;
    auto text = std::exchange(text_, {});
    log_ << text << std::flush;  // the task's log, for the shell's `log` and `attach`
    box_.push(identity_, event_bytes([&](schema::ClientEvent::Builder e) {
                auto out = e.initOutput();
                out.setStream(stream_);
                out.setText(text);
              }));
    return 0;
  }

private:
  outbox& box_;
  std::string identity_;
  uint8_t stream_;
  std::ofstream& log_;
  std::string text_;
};

struct submission {
  std::string identity;
  std::string id;  // its directory's name
  std::thread thread;
  std::atomic<bool> done{false};
};

}  // namespace

struct submission_server::impl {
  node_session& session;
  submission_server_config config;
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
  // After the router: destroyed first (it watches the router's handshakes).
  std::unique_ptr<cluster::curve_server_auth> auth;
  outbox box;
  struct pending_frame {
    std::string identity, bytes;
    std::chrono::steady_clock::time_point since;
  };
  std::deque<pending_frame> unsent;  // frames for clients not connected, in order
  std::vector<std::unique_ptr<submission>> runs;
  uint64_t next_run = 1;

  search_controls controls;  // the running submissions' searches
  shell_context shell;

  impl(node_session& s, submission_server_config c)
    : session(s), config(std::move(c)),
      shell{s, config.state_dir, config.node_endpoint, !config.token_file.empty(), {},
            &controls} {}

  void refuse(const std::string& identity, const std::string& why) {
    box.push(identity, event_bytes([&](schema::ClientEvent::Builder e) { e.setRefused(why); }));
  }

  void on_request(const std::string& identity, const std::string& bytes);
  void on_submit(const std::string& identity, const std::string& request_bytes,
                 schema::Submission::Reader sub);
  void start_run(const std::string& identity, const fs::path& run_dir,
                 schema::Submission::Reader sub, bool resume);
  void resume_unfinished();
  // tcp://HOST:* on the client port's host.
  std::string operator_endpoint() const {
    auto at = bound.rfind(':');
    return (at == std::string::npos ? std::string("tcp://127.0.0.1") : bound.substr(0, at)) + ":*";
  }
  std::string bound;  // the client port's endpoint
  std::deque<messages::decoded_message> resumed_messages;  // their submissions, read by runs
  void status(const std::string& identity);
};

namespace {

// One submission's run, in its own thread: the same steps as `optimize` after its command
// line, on the supervisor's session.
int run_submission(node_session& session, optimize_options opts, const std::string& state_dir,
                   run_io io) {
  auto& err = io.err;
  auto started = std::chrono::steady_clock::now();
  std::string error;
  spec_kind kind;
  config::brain_config brains;
  if (!read_optimize_inputs(opts, kind, brains, error)) {
    err << "error: " << error << "\n";
    return 2;
  }
  if (!opts.out.empty() && !make_output_dir(opts.out, error)) {
    err << "error: " << error << "\n";
    return 3;
  }
  std::optional<messages::decoded_message> spec;
  if (int code = load_task_spec(session, opts.spec, kind, opts.chip, opts.memory_limit_bytes,
                                spec, error)) {
    err << "error: " << error << "\n";
    return code;
  }
  return optimize_on_session(session, spec->root<schema::KernelSpec>(), opts, brains, state_dir,
                             started, std::move(io));
}

void read_outputs(const fs::path& dir, std::vector<std::pair<std::string, std::string>>& files) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return;
  for (auto& entry : fs::recursive_directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec))
      continue;
    files.emplace_back(fs::relative(entry.path(), dir, ec).string(), read_whole_file(entry.path()));
  }
}

}  // namespace

void submission_server::impl::on_submit(const std::string& identity,
                                        const std::string& request_bytes,
                                        schema::Submission::Reader sub) {
  std::string error;
  if (!check_submission(sub, error))
    return refuse(identity, error);
  std::string name = sub.getSpecName().cStr();

  // The task's own copy, where the run reads it and writes its outputs.
  auto stamp = std::chrono::system_clock::now().time_since_epoch();
  // Ids sort in submission order (the shell's latest task of a name, --resume's order).
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(stamp).count();
  auto run_dir = fs::path(config.state_dir) / "submissions"
                 / fmt::format("{}-{:04}", seconds, next_run++);
  auto task_root = run_dir / "task";
  std::error_code ec;
  fs::create_directories(task_root, ec);
  if (ec)
    return refuse(identity, "cannot make " + task_root.string() + ": " + ec.message());
  auto spec_path = sub.getSpecIsDirectory() ? task_root / name : task_root;
  for (auto f : sub.getFiles()) {
    auto target = spec_path / f.getPath().cStr();
    fs::create_directories(target.parent_path(), ec);
    std::ofstream out(target, std::ios::binary);
    auto data = f.getData();
    out.write(reinterpret_cast<const char*>(data.begin()), static_cast<std::streamsize>(data.size()));
    if (!out)
      return refuse(identity, "cannot write " + target.string());
  }
  // Kept for --resume: a restarted supervisor runs it again for the same client.
  if (!write_output((run_dir / "request.bin").string(), request_bytes, error)
      || !write_output((run_dir / "client").string(), identity, error))
    return refuse(identity, error);
  box.push(identity, event_bytes([&](schema::ClientEvent::Builder e) {
             auto reply = e.initReply();
             reply.setOk(true);
             reply.setText("submitted " + run_dir.filename().string() + "\n");
           }));
  start_run(identity, run_dir, sub, false);
}

void submission_server::impl::start_run(const std::string& identity, const fs::path& run_dir,
                                        schema::Submission::Reader sub, bool resume) {
  // A run refused now is never resumed.
  auto refuse_run = [&](const std::string& why) {
    std::string error;
    write_output((run_dir / "exit_code").string(), "2\n", error);
    refuse(identity, why);
  };
  std::string name = sub.getSpecName().cStr();
  auto spec_path = run_dir / "task" / name;
  // The options, read by the same parser as the command line's.
  optimize_options opts;
  CLI::App parser{"optimize"};
  add_optimize_options(&parser, opts, config::chip_names());
  std::vector<std::string> args;
  for (auto a : sub.getArgs())
    args.emplace_back(a.cStr());
  if (resume)
    args.emplace_back("--resume");
  args.push_back(spec_path.string());
  std::reverse(args.begin(), args.end());  // CLI11 reads the vector from its back
  try {
    parser.parse(args);
  } catch (const CLI::ParseError& e) {
    return refuse_run(std::string("options: ") + e.what());
  }
  if (!opts.out.empty() || !opts.json.empty() || !opts.state_dir.empty())
    return refuse_run("--out, --json and --state-dir name the client's files: the client "
                      "keeps them");
  opts.spec = spec_path.string();
  opts.out = (run_dir / "out").string();  // for the shell too; sent back when wanted
  bool send_files = sub.getWantOutputs();
  opts.state_dir = config.state_dir;
  // hitl: the gateway listens beside the client port, with the cluster's credentials; a
  // client's --console attaches to it from the client's terminal.
  opts.console = false;
  opts.operator_endpoint = operator_endpoint();
  opts.operator_token_file = config.token_file;

  auto run = std::make_unique<submission>();
  run->identity = identity;
  auto* r = run.get();
  std::string out_shown = sub.getOutShown().cStr();
  auto id = run_dir.filename().string();
  shell.running.insert(id);
  r->id = id;
  r->thread = std::thread([this, r, opts, out_shown, run_dir, send_files] {
    std::string json;
    int code;
    {
      std::ofstream log(run_dir / "log.txt", std::ios::app);
      client_stream out_buf(box, r->identity, 1, log), err_buf(box, r->identity, 2, log);
      std::ostream out(&out_buf), err(&err_buf);
      run_io io{out, err, &json, out_shown};
      io.on_search = [this, id = r->id](search_controller c) { controls.set(id, std::move(c)); };
      code = run_submission(session, opts, config.state_dir, std::move(io));
      out.flush();
      err.flush();
    }
    std::vector<std::pair<std::string, std::string>> files;
    if (send_files)
      read_outputs(opts.out, files);
    std::string error;
    write_output((run_dir / "exit_code").string(), std::to_string(code) + "\n", error);
    box.push(r->identity, event_bytes([&](schema::ClientEvent::Builder e) {
               auto f = e.initFinished();
               f.setExitCode(code);
               f.setJson(json);
               auto list = f.initFiles(static_cast<unsigned>(files.size()));
               for (unsigned i = 0; i < files.size(); ++i) {
                 list[i].setPath(files[i].first);
                 list[i].setData(kj::arrayPtr(
                   reinterpret_cast<const kj::byte*>(files[i].second.data()),
                   files[i].second.size()));
               }
             }));
    r->done = true;
  });
  runs.push_back(std::move(run));
}

void submission_server::impl::resume_unfinished() {
  std::error_code ec;
  auto root = fs::path(config.state_dir) / "submissions";
  if (!fs::is_directory(root, ec))
    return;
  std::vector<fs::path> dirs;
  for (auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory(ec) && fs::exists(entry.path() / "request.bin", ec)
        && !fs::exists(entry.path() / "exit_code", ec))
      dirs.push_back(entry.path());
  std::sort(dirs.begin(), dirs.end());
  for (auto& dir : dirs) {
    std::string error;
    auto bytes = read_whole_file(dir / "request.bin");
    auto msg = messages::decoded_message::parse(bytes, error);
    if (!msg)
      continue;
    try {
      auto req = msg->root<schema::ClientRequest>();
      if (!req.isSubmit())
        continue;
      std::cerr << "supervisor: resuming " << dir.filename().string() << "\n";
      resumed_messages.push_back(std::move(*msg));
      start_run(read_whole_file(dir / "client"), dir,
                resumed_messages.back().root<schema::ClientRequest>().getSubmit(), true);
    } catch (const kj::Exception& e) {
      std::cerr << "supervisor: cannot resume " << dir.string() << ": "
                << e.getDescription().cStr() << "\n";
    }
  }
}

void submission_server::impl::status(const std::string& identity) {
  auto answer = session.cluster_status();
  box.push(identity, event_bytes([&](schema::ClientEvent::Builder e) { e.setStatus(answer); }));
}

void submission_server::impl::on_request(const std::string& identity, const std::string& bytes) {
  std::string error;
  auto msg = read_client_request(bytes, error);
  if (!msg)
    return refuse(identity, error);
  try {
    auto req = msg->root<schema::ClientRequest>();
    switch (req.which()) {
      case schema::ClientRequest::SUBMIT:
        return on_submit(identity, bytes, req.getSubmit());
      case schema::ClientRequest::STATUS:
        return status(identity);
      case schema::ClientRequest::COMMAND: {
        std::vector<std::string> words;
        for (auto w : req.getCommand())
          words.emplace_back(w.cStr());
        box.push(identity, event_bytes([&](schema::ClientEvent::Builder e) {
                   answer_shell(shell, words, e.initReply());
                 }));
        return;
      }
    }
    refuse(identity, "unknown request");
  } catch (const kj::Exception& e) {
    refuse(identity, std::string("malformed request: ") + e.getDescription().cStr());
  }
}

submission_server::submission_server(node_session& session, submission_server_config config)
  : impl_(std::make_unique<impl>(session, std::move(config))) {}

submission_server::~submission_server() {
  // A run still going when the supervisor stops is cut short; what it finished is in the
  // store and its search graph, for --resume.
  for (auto& r : impl_->runs)
    if (r->thread.joinable())
      r->done ? r->thread.join() : r->thread.detach();
}

bool submission_server::bind(std::string& error) {
  auto& io = *impl_;
  try {
    if (!io.config.token_file.empty()) {
      auto creds = cluster::read_cluster_credentials(io.config.token_file, error);
      if (!creds)
        return false;
      // With the router: peers refused before any ZAP request (no CURVE, another cluster's
      // server key) are logged too, not only those with a wrong client key.
      io.auth = std::make_unique<cluster::curve_server_auth>(io.context, *creds,
                                                             cluster::curve_server_auth::log_function{},
                                                             &io.router);
      cluster::make_curve_server(io.router, *creds);
    }
    io.router.set(zmq::sockopt::router_mandatory, 1);
    io.router.set(zmq::sockopt::linger, 1000);
    io.router.bind(io.config.endpoint);
    endpoint_ = io.router.get(zmq::sockopt::last_endpoint);
    io.bound = endpoint_;
  } catch (const zmq::error_t& e) {
    error = fmt::format("cannot listen on {} for clients: {}", io.config.endpoint, e.what());
    return false;
  }
  return true;
}

void submission_server::serve(const std::atomic<bool>& stop) {
  auto& io = *impl_;
  if (io.config.resume)
    io.resume_unfinished();
  while (!stop) {
    zmq::pollitem_t items[] = {{io.router.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(50));
    } catch (const zmq::error_t&) {
      continue;  // interrupted by a signal: `stop` says whether to go on
    }
    if (items[0].revents & ZMQ_POLLIN) {
      std::vector<zmq::message_t> frames;
      if (zmq::recv_multipart(io.router, std::back_inserter(frames), zmq::recv_flags::dontwait)
          && frames.size() == 2)
        io.on_request(frames[0].to_string(), frames[1].to_string());
    }
    // A client not connected (yet: it reconnects to a restarted supervisor by itself) keeps
    // its frames for a minute.
    auto now = std::chrono::steady_clock::now();
    for (auto& [identity, bytes] : io.box.take())
      io.unsent.push_back({std::move(identity), std::move(bytes), now});
    std::deque<impl::pending_frame> keep;
    for (auto& f : io.unsent) {
      bool sent = send_frame(io.router, f.identity, f.bytes);
      if (!sent && now - f.since < std::chrono::minutes(1))
        keep.push_back(std::move(f));
    }
    io.unsent = std::move(keep);
    for (auto it = io.runs.begin(); it != io.runs.end();) {
      if ((*it)->done) {
        (*it)->thread.join();
        io.shell.running.erase((*it)->id);
        it = io.runs.erase(it);
      } else {
        ++it;
      }
    }
  }
  // The clients of runs still going learn why the run goes quiet (each keeps waiting, and
  // hears from it again when the supervisor is started with --resume).
  for (auto& r : io.runs)
    if (!r->done)
      io.box.push(r->identity, event_bytes([&](schema::ClientEvent::Builder e) {
                    auto out = e.initOutput();
                    out.setStream(2);
                    out.setText("supervisor: stopped with this run unfinished ("
                                + r->id + "); it goes on when the supervisor is started again "
                                "with --resume\n");
                  }));
  for (auto& f : io.unsent)
    send_frame(io.router, f.identity, f.bytes);
  for (auto& [identity, bytes] : io.box.take())
    send_frame(io.router, identity, bytes);
  // Sent before the process ends (it may end with _Exit): terminating the context waits for
  // queued frames, up to the router's linger. The ZAP handler's sockets go first, or the
  // termination would wait for them.
  io.auth.reset();
  io.router.close();
  io.context.close();
}

size_t submission_server::unfinished() const {
  size_t n = 0;
  for (auto& r : impl_->runs)
    n += r->done ? 0 : 1;
  return n;
}

}  // namespace maxkernel::cli
