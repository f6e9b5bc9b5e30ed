#include "cli/node_session.hpp"

#include "maxkernel/schema/cluster.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "cluster/cluster_credentials.hpp"
#include "cluster/dispatcher.hpp"
#include "cluster/secure_transport.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"
#include "search/evaluation_store.hpp"
#include "search/state_dir.hpp"
#include "tpu_nodes/pool_config.hpp"
#include "tpu_nodes/store_front.hpp"
#include "tpu_nodes/task_files.hpp"
#include "tpu_nodes/tpu_node.hpp"
#include "tpu_nodes/worker_pool.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <thread>

namespace maxkernel::cli {

struct node_session::impl {
  // Declared before the actor system: its nodes write here until the system is gone.
  std::unique_ptr<tpu_nodes::task_files> shipped;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<search::evaluation_store> store;
  messages::worker_pool_actor pool;
  std::vector<messages::tpu_node_actor> nodes;
  messages::dispatcher_actor dispatcher;
  messages::tpu_node_actor front;  // the dispatcher, or the one node
  messages::tpu_node_actor store_front;  // a supervisor's: the store before the dispatcher
};

namespace {

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "host";
}

int exit_code_of(const caf::error& e) {
  return messages::exit_code_for(messages::code_of(e));
}

}  // namespace

node_session::node_session(session_options opts)
    : impl_(std::make_unique<impl>()), opts_(std::move(opts)) {}

node_session::~node_session() {
  if (impl_->sys) {
    caf::scoped_actor self{*impl_->sys};
    if (impl_->store_front)
      self->send_exit(impl_->store_front, caf::exit_reason::user_shutdown);
    if (impl_->dispatcher)
      self->send_exit(impl_->dispatcher, caf::exit_reason::user_shutdown);
    for (auto& node : impl_->nodes)
      self->send_exit(node, caf::exit_reason::user_shutdown);
    if (impl_->pool)
      self->send_exit(impl_->pool, caf::exit_reason::user_shutdown);
  }
}

const std::vector<messages::tpu_node_actor>& node_session::local_nodes() const {
  return impl_->nodes;
}

bool node_session::start_supervisor(std::string& error) {
  cluster::dispatcher_config dc;
  dc.default_deadline = opts_.deadline;
  dc.wait_for_nodes = true;
  // A remote node has workers of its own: a second request waiting at it keeps its device
  // busy between answers (scripts/bench-cluster: efficiency 0.91-0.95 with one credit, 0.98-1.0
  // with two, at a simulated 20 ms per evaluation).
  dc.credits_per_node = 2;
  dc.log = [](const std::string& line) { std::cerr << "supervisor: " + line + "\n"; };
  impl_->dispatcher = cluster::spawn_dispatcher(*impl_->sys, {}, dc);
  tpu_nodes::store_front_config sc;
  sc.store = impl_->store.get();
  sc.default_deadline = opts_.deadline;
  impl_->store_front = tpu_nodes::spawn_store_front(*impl_->sys, sc, impl_->dispatcher);
  impl_->front = impl_->store_front;
  auto port = cluster::publish_actor(*impl_->sys, caf::actor_cast<caf::actor>(impl_->dispatcher),
                                     opts_.listen_host, opts_.listen_port,
                                     impl_->sys->message_types(impl_->dispatcher));
  if (!port) {
    error = fmt::format("cannot listen on {}:{} for nodes: {}", opts_.listen_host,
                        opts_.listen_port, messages::message_of(port.error()));
    return false;
  }
  listen_port_ = *port;
  return true;
}

bool node_session::start(std::string& error) {
  backend_ = !opts_.backend.empty()                  ? opts_.backend
             : tpu_nodes::tpu_chips_on_host() > 0 ? "jax-tpu"
                                                  : "model";
  bool node_process = opts_.role == session_options::cluster_role::node;
  // A node process: the supervisor keeps the store; a node-local one (a host-local cache of
  // repeats) only when a state directory is given.
  if (opts_.use_store && (!node_process || !opts_.state_dir.empty())) {
    auto dir = opts_.state_dir.empty() ? search::default_state_dir() : opts_.state_dir;
    store_path_ = search::default_store_path(dir);
    impl_->store = search::evaluation_store::open(store_path_, error);
    if (!impl_->store)
      return false;
  }
  messages::register_types(impl_->cfg);
  if (opts_.role != session_options::cluster_role::none) {
    impl_->cfg.load<caf::io::middleman>();
    impl_->cfg.set("middleman.heartbeat-interval", caf::timespan{opts_.heartbeat});
    impl_->cfg.set("middleman.connection-timeout", caf::timespan{opts_.connection_timeout});
    if (!opts_.token_file.empty()) {
      auto creds = cluster::read_cluster_credentials(opts_.token_file, error);
      if (!creds)
        return false;
      cluster::enable_cluster_tls(impl_->cfg, *creds);
    }
  }
  impl_->sys = std::make_unique<caf::actor_system>(impl_->cfg);
  if (opts_.role == session_options::cluster_role::supervisor)
    return start_supervisor(error);
  tpu_nodes::pool_config pc;
  pc.backend = backend_;
  pc.workers = opts_.workers;
  workers_ = tpu_nodes::resolved_worker_count(pc);
  pc.worker.memory_limit_bytes = opts_.memory_limit_bytes;
  impl_->pool = tpu_nodes::spawn_worker_pool(*impl_->sys, pc);
  // Task directories that come with requests from a supervisor on another host.
  if (node_process)
    impl_->shipped = std::make_unique<tpu_nodes::task_files>();
  for (unsigned i = 0; i < std::max(1u, opts_.nodes); ++i) {
    tpu_nodes::node_config nc;
    nc.node_id = node_process ? fmt::format("{}:{}:{}", host_name(), ::getpid(), i)
                              : fmt::format("local:{}", i);
    nc.device = i;
    nc.chip = opts_.chip.empty() ? "v6e" : opts_.chip;
    nc.backend = backend_;
    nc.queue_capacity = 4;
    nc.default_deadline = opts_.deadline;
    nc.store = impl_->store.get();
    nc.simulate_device = opts_.simulate_device;
    nc.shipped = impl_->shipped.get();
    impl_->nodes.push_back(tpu_nodes::spawn_tpu_node(*impl_->sys, nc, impl_->pool));
  }
  if (node_process) {
    impl_->front = impl_->nodes.front();
  } else if (opts_.dispatch || impl_->nodes.size() > 1) {
    cluster::dispatcher_config dc;
    dc.default_deadline = opts_.deadline;
    // One host: every node shares the same workers, so a straggler's copy competes with the
    // original for them; copy only what is far behind (an interpret-mode test takes minutes).
    dc.straggler_min = std::chrono::minutes(2);
    dc.straggler_factor = 3.0;
    impl_->dispatcher = cluster::spawn_dispatcher(*impl_->sys, impl_->nodes, dc);
    impl_->front = impl_->dispatcher;
  } else {
    impl_->front = impl_->nodes.front();
  }

  // Wait for the worker: the node reports its JAX version once one has started.
  caf::scoped_actor self{*impl_->sys};
  auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (std::chrono::steady_clock::now() < give_up) {
    bool done = false;
    self->request(impl_->front, std::chrono::seconds(30), messages::info_atom::value)
      .receive(
        [&](messages::payload& p) {
          auto msg = messages::open_payload<schema::NodeInfo>(p, error);
          if (!msg)
            return;
          auto info = msg->root<schema::NodeInfo>();
          if (info.getJaxVersion().size() > 0) {
            jax_version_ = info.getJaxVersion().cStr();
            done = true;
          } else if (info.getWorkersRestarting() > 0) {
            for (auto w : info.getWorkerStates())
              if (w.getStartFailures() > 0) {
                error = "the JAX worker does not start: " + std::string(w.getLastError().cStr());
                done = true;
              }
          }
        },
        [&](caf::error& e) {
          error = "the TPU node does not answer: " + caf::to_string(e);
          done = true;
        });
    if (done)
      return !jax_version_.empty();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  error = "the JAX worker did not start within 3 minutes";
  return false;
}

namespace {

template <class... Args>
session_answer ask(caf::actor_system& sys, const messages::tpu_node_actor& node,
                   std::chrono::milliseconds deadline, Args&&... args) {
  session_answer answer;
  caf::scoped_actor self{sys};
  // The node enforces the deadline; the margin only guards against a node that vanished.
  self->request(node, deadline + std::chrono::seconds(30), std::forward<Args>(args)...)
    .receive([&](messages::payload& p) { answer.bytes = std::move(p.bytes); },
             [&](caf::error& e) {
               answer.exit_code = exit_code_of(e);
               answer.error = messages::message_of(e);
               answer.timed_out = messages::code_of(e) == messages::error_code::worker_timeout;
               answer.worker_died = messages::code_of(e) == messages::error_code::worker_crashed;
             });
  if (answer.exit_code == 0 && answer.bytes.empty()) {
    answer.exit_code = 3;
    answer.error = "the TPU node sent an empty answer";
  }
  return answer;
}

}  // namespace

session_answer node_session::evaluate(const std::string& request) {
  messages::payload p{capnp::typeId<schema::EvalRequest>(), request};
  return ask(*impl_->sys, impl_->front, opts_.deadline, messages::evaluate_atom::value,
             std::move(p), static_cast<uint32_t>(opts_.deadline.count()));
}

session_answer node_session::analyze(const std::string& request) {
  messages::payload p{capnp::typeId<schema::AnalyzeRequest>(), request};
  return ask(*impl_->sys, impl_->front, opts_.deadline, messages::analyze_atom::value,
             std::move(p));
}

caf::actor_system& node_session::system() { return *impl_->sys; }

namespace {

// Reads the dispatcher's status into `read`; false with `error` when it does not answer.
bool read_status(caf::actor_system& sys, const messages::dispatcher_actor& dispatcher,
                 const std::function<void(schema::DispatcherStatus::Reader)>& read,
                 std::string& error) {
  if (!dispatcher) {
    error = "no dispatcher";
    return false;
  }
  bool ok = false;
  caf::scoped_actor self{sys};
  self->request(dispatcher, std::chrono::seconds(5), messages::status_atom::value)
    .receive(
      [&](messages::payload& p) {
        auto msg = messages::open_payload<schema::DispatcherStatus>(p, error);
        if (!msg)
          return;
        read(msg->root<schema::DispatcherStatus>());
        ok = true;
      },
      [&](caf::error& e) { error = "the dispatcher does not answer: " + messages::message_of(e); });
  return ok;
}

}  // namespace

std::string node_session::cluster_status() {
  std::string text, error;
  bool ok = read_status(*impl_->sys, impl_->dispatcher, [&](schema::DispatcherStatus::Reader s) {
    unsigned alive = 0;
    for (auto n : s.getNodes()) {
      alive += n.getAlive() ? 1 : 0;
      text += fmt::format("node {} {}: {}, {} in flight, {} done{}\n", n.getIndex(),
                          n.getNodeId().cStr(),
                          !n.getAlive() ? "lost" : n.getDraining() ? "alive draining" : "alive",
                          n.getInFlight(), n.getCompleted(),
                          n.getChip().size() > 0
                            ? fmt::format(", {} {}", n.getChip().cStr(), n.getBackend().cStr())
                            : "");
    }
    text += fmt::format("{} of {} node(s) alive; {} queued, {} in flight, {} completed; {} "
                        "node loss(es), {} request(s) moved off lost nodes, {} straggler "
                        "copies\n",
                        alive, s.getNodes().size(), s.getQueued(), s.getInFlight(),
                        s.getCompleted(), s.getNodesLost(), s.getOrphaned(), s.getRedispatched());
  }, error);
  return ok ? text : error;
}

void node_session::learn_jax_version() {
  if (!jax_version_.empty())
    return;
  caf::scoped_actor self{*impl_->sys};
  self->request(impl_->front, std::chrono::seconds(30), messages::info_atom::value)
    .receive(
      [&](messages::payload& p) {
        std::string error;
        if (auto msg = messages::open_payload<schema::NodeInfo>(p, error))
          jax_version_ = msg->root<schema::NodeInfo>().getJaxVersion().cStr();
      },
      [](caf::error&) {});
}

bool node_session::drain_node(uint32_t index, std::string& error) {
  if (!impl_->dispatcher) {
    error = "no dispatcher";
    return false;
  }
  bool known = false;
  caf::scoped_actor self{*impl_->sys};
  self->request(impl_->dispatcher, std::chrono::seconds(5), messages::drain_atom::value, index)
    .receive([&](bool found) { known = found; },
             [&](caf::error& e) { error = "the dispatcher does not answer: " + messages::message_of(e); });
  if (!known && error.empty())
    error = fmt::format("no node {}", index);
  return known;
}

std::optional<cluster_counts> node_session::cluster_counts_now() {
  if (opts_.role != session_options::cluster_role::supervisor)
    return std::nullopt;
  cluster_counts c;
  std::string error;
  bool ok = read_status(*impl_->sys, impl_->dispatcher, [&](schema::DispatcherStatus::Reader s) {
    for (auto n : s.getNodes())
      c.alive += n.getAlive() ? 1 : 0;
    c.nodes_lost = s.getNodesLost();
    c.orphaned = s.getOrphaned();
    c.straggler_copies = s.getRedispatched();
  }, error);
  if (!ok)
    return std::nullopt;
  return c;
}

messages::tpu_node_actor node_session::evaluator() { return impl_->front; }
messages::dispatcher_actor node_session::dispatcher() { return impl_->dispatcher; }

namespace {

// A task directory's regular files, relative to it, for nodes on other hosts. False with
// `error` (a file that does not read, more than a node takes).
bool read_task_files(const std::string& dir, std::vector<std::pair<std::string, std::string>>& files, std::string& error) {
  namespace fs = std::filesystem;
  tpu_nodes::task_file_limits limits;
  std::error_code ec;
  uint64_t total = 0;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec))
      continue;
    auto rel = fs::relative(it->path(), dir, ec).generic_string();
    std::ifstream in(it->path(), std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      error = fmt::format("{}: cannot read", it->path().string());
      return false;
    }
    total += data.size();
    if (files.size() >= limits.max_files || total > limits.max_bytes) {
      error = fmt::format("{}: more than {} files or {} bytes, more than a node takes", dir,
                          limits.max_files, limits.max_bytes);
      return false;
    }
    files.emplace_back(std::move(rel), std::move(data));
  }
  if (ec) {
    error = fmt::format("{}: {}", dir, ec.message());
    return false;
  }
  // In path order, not the directory's: the spec's bytes (its store and search keys) must
  // not depend on how the file system lists it.
  std::sort(files.begin(), files.end());
  return true;
}

void set_task_files(capnp::List<schema::TaskFile>::Builder list,
                    const std::vector<std::pair<std::string, std::string>>& files) {
  for (unsigned i = 0; i < files.size(); ++i) {
    list[i].setPath(files[i].first);
    auto& data = files[i].second;
    list[i].setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(data.data()), data.size()));
  }
}

}  // namespace

session_answer node_session::load_task(const std::string& path) {
  session_answer answer;
  if (opts_.role == session_options::cluster_role::supervisor) {
    answer = load_shipped(path);
  } else {
    answer = ask(*impl_->sys, impl_->front, opts_.deadline, messages::load_atom::value, path);
  }
  // Loading runs the task's own code (create_inputs, get_inputs, the reference under
  // eval_shape): past the deadline that code is what hangs, a fault of the input.
  if (answer.timed_out) {
    answer.exit_code = 2;
    answer.error = fmt::format("{}: the task's code did not finish within {:g} s (does "
                               "create_inputs, get_inputs or the reference loop forever?); "
                               "--deadline sets the limit",
                               path, std::chrono::duration<double>(opts_.deadline).count());
  } else if (answer.worker_died) {
    // The worker was serving nothing but this task's code (os._exit, a crash in an extension,
    // the sandbox's memory limit): the task is what failed.
    answer.exit_code = 2;
    answer.error = fmt::format("{}: running the task's code: {}; does it call os._exit or "
                               "exhaust memory?", path, answer.error);
  }
  return answer;
}

// A supervisor's nodes may be on other hosts: the directory's files go with the load, and
// the spec that comes back carries them to every later request (docs/cluster.md).
session_answer node_session::load_shipped(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> files;
  session_answer answer;
  if (!read_task_files(path, files, answer.error)) {
    answer.exit_code = 2;
    return answer;
  }
  capnp::MallocMessageBuilder request;
  auto load = request.initRoot<schema::LoadRequest>();
  load.setPath(path);
  set_task_files(load.initTaskFiles(static_cast<unsigned>(files.size())), files);
  answer = ask(*impl_->sys, impl_->front, opts_.deadline, messages::load_atom::value,
               messages::make_payload<schema::LoadRequest>(request));
  if (answer.exit_code != 0)
    return answer;
  std::string error;
  auto spec = messages::decode<schema::KernelSpec>(answer.bytes, error);
  if (!spec) {
    answer.exit_code = 3;
    answer.error = "the node sent a bad KernelSpec: " + error;
    return answer;
  }
  capnp::MallocMessageBuilder copy;
  copy.setRoot(spec->root<schema::KernelSpec>());
  auto out = copy.getRoot<schema::KernelSpec>();
  set_task_files(out.initTaskFiles(static_cast<unsigned>(files.size())), files);
  answer.bytes = messages::encode(copy);
  return answer;
}

}  // namespace maxkernel::cli
