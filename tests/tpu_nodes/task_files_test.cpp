// Task directories shipped with the work (tpu_nodes/task_files.hpp): what a node accepts and
// where it writes it, and a tpu_node that hands its pool specs naming the written directory
// while its store keys and its load replies keep the requester's paths. The pool is a
// stand-in (no JAX) under CAF's deterministic scheduler.
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"
#include "messages/worker_pool_actor.hpp"
#include "search/evaluation_store.hpp"
#include "tests/support/deterministic_system.hpp"
#include "tests/support/eval_requests.hpp"
#include "tpu_nodes/evaluator_revision.hpp"
#include "tpu_nodes/request_key.hpp"
#include "tpu_nodes/task_files.hpp"
#include "tpu_nodes/tpu_node.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <gtest/gtest.h>

#include <capnp/message.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

using namespace maxkernel;
using messages::payload;
namespace fs = std::filesystem;

namespace {

using file_list = std::vector<std::pair<std::string, std::string>>;

void fill(capnp::List<schema::TaskFile>::Builder list, const file_list& files) {
  for (unsigned i = 0; i < files.size(); ++i) {
    list[i].setPath(files[i].first);
    list[i].setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(files[i].second.data()),
                                 files[i].second.size()));
  }
}

// A TaskFile list in a message of its own (a KernelSpec holding them).
struct shipment {
  explicit shipment(const file_list& files) {
    auto spec = msg.initRoot<schema::KernelSpec>();
    fill(spec.initTaskFiles(static_cast<unsigned>(files.size())), files);
  }
  capnp::List<schema::TaskFile>::Reader files() {
    return msg.getRoot<schema::KernelSpec>().asReader().getTaskFiles();
  }
  capnp::MallocMessageBuilder msg;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch directory, removed at the end.
struct scratch {
  scratch() {
    char pattern[] = "/tmp/task-files-test-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (auto& e : fs::recursive_directory_iterator(path))
      out.push_back(fs::relative(e.path(), path).string());
    return out;
  }
  fs::path path;
};

const file_list jaxbench = {{"baseline.py", "CONFIG = {}\n"},
                            {"optimized.py", "# hand-tuned\n"},
                            {"lib/helpers.py", "X = 1\n"}};

}  // namespace

TEST(TaskPath, AcceptsPathsInsideTheTaskOnly) {
  tpu_nodes::task_file_limits limits;
  std::string why;
  for (const char* good : {"baseline.py", "lib/helpers.py", "a/b/c.txt", "..hidden", "x..y"})
    EXPECT_TRUE(tpu_nodes::valid_task_path(good, limits, why)) << good << ": " << why;
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/", ".",
                          "..", "a\\..\\b"}) {
    why.clear();
    EXPECT_FALSE(tpu_nodes::valid_task_path(bad, limits, why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
  EXPECT_FALSE(tpu_nodes::valid_task_path(std::string("a\0b", 3), limits, why));
  limits.max_depth = 2;
  EXPECT_TRUE(tpu_nodes::valid_task_path("a/b/c", limits, why));
  EXPECT_FALSE(tpu_nodes::valid_task_path("a/b/c/d", limits, why));
  EXPECT_NE(why.find("deeper"), std::string::npos) << why;
}

TEST(TaskFilesHash, IsTheContentNotTheOrder) {
  shipment a(jaxbench);
  shipment b({jaxbench[2], jaxbench[0], jaxbench[1]});
  shipment c({{"baseline.py", "CONFIG = {}\n"}, {"optimized.py", "# other\n"},
              {"lib/helpers.py", "X = 1\n"}});
  // The same bytes split differently between path and data are other contents.
  shipment d(file_list{{"ab", "c"}});
  shipment e(file_list{{"a", "bc"}});
  EXPECT_EQ(tpu_nodes::task_files_hash(a.files()), tpu_nodes::task_files_hash(b.files()));
  EXPECT_NE(tpu_nodes::task_files_hash(a.files()), tpu_nodes::task_files_hash(c.files()));
  EXPECT_NE(tpu_nodes::task_files_hash(d.files()), tpu_nodes::task_files_hash(e.files()));
}

TEST(TaskFiles, WritesEachContentOnceInAPrivateDirectory) {
  scratch tmp;
  std::string root;
  {
    tpu_nodes::task_files shipped(tmp.path.string());
    EXPECT_EQ(shipped.root(), "");  // nothing made before it is needed
    shipment a(jaxbench);
    std::string why;
    auto dir = shipped.materialize(a.files(), "jaxbench_matmul", why);
    ASSERT_TRUE(dir) << why;
    root = shipped.root();
    EXPECT_EQ(fs::path(root).parent_path(), tmp.path);
    struct stat st {};
    ASSERT_EQ(::stat(root.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(fs::path(*dir).filename(), "jaxbench_matmul");  // the worker names tasks after it
    EXPECT_EQ(read_file(fs::path(*dir) / "baseline.py"), "CONFIG = {}\n");
    EXPECT_EQ(read_file(fs::path(*dir) / "lib" / "helpers.py"), "X = 1\n");

    // The same contents again (in another order): the same directory, not written again.
    fs::remove(fs::path(*dir) / "optimized.py");  // would come back if it were rewritten
    shipment again({jaxbench[1], jaxbench[2], jaxbench[0]});
    auto second = shipped.materialize(again.files(), "jaxbench_matmul", why);
    ASSERT_TRUE(second) << why;
    EXPECT_EQ(*second, *dir);
    EXPECT_FALSE(fs::exists(fs::path(*dir) / "optimized.py"));
    EXPECT_EQ(shipped.written(), 1u);

    // Other contents: another directory beside it.
    shipment other(file_list{{"baseline.py", "CONFIG = {'name': 'x'}\n"}});
    auto third = shipped.materialize(other.files(), "jaxbench_matmul", why);
    ASSERT_TRUE(third) << why;
    EXPECT_NE(*third, *dir);
    EXPECT_EQ(shipped.written(), 2u);

    // A name that is no single path component becomes "task".
    auto fourth = shipped.materialize(other.files(), "../evil", why);
    ASSERT_TRUE(fourth) << why;
    EXPECT_EQ(fs::path(*fourth).filename(), "task");
    EXPECT_EQ(fs::path(*fourth).parent_path().parent_path(), fs::path(root));
  }
  EXPECT_FALSE(fs::exists(root));  // removed with the process's task_files
}

TEST(TaskFiles, RefusesAHostileShipmentWithoutWritingAnything) {
  scratch tmp;
  tpu_nodes::task_files shipped(tmp.path.string());
  struct hostile {
    file_list files;
    const char* says;
  };
  std::vector<hostile> cases = {
    {{{"baseline.py", "x"}, {"../escape.py", "x"}}, "'../escape.py'"},
    {{{"/tmp/absolute.py", "x"}}, "absolute"},
    {{{"a/../../escape.py", "x"}}, "'a/../../escape.py'"},
    {{{"baseline.py", "x"}, {"baseline.py", "y"}}, "twice"},
    {{{"lib", "x"}, {"lib/helpers.py", "y"}}, "both as a file and as a directory"},
  };
  for (auto& c : cases) {
    shipment s(c.files);
    std::string why;
    EXPECT_FALSE(shipped.materialize(s.files(), "t", why));
    EXPECT_NE(why.find(c.says), std::string::npos) << why;
  }
  EXPECT_TRUE(tmp.entries().empty());  // not even the process's directory

  tpu_nodes::task_file_limits small;
  small.max_bytes = 10;
  small.max_files = 2;
  tpu_nodes::task_files capped(tmp.path.string(), small);
  std::string why;
  shipment big(file_list{{"a.py", std::string(11, 'x')}});
  EXPECT_FALSE(capped.materialize(big.files(), "t", why));
  EXPECT_NE(why.find("more than 10 bytes"), std::string::npos) << why;
  shipment many(file_list{{"a", ""}, {"b", ""}, {"c", ""}});
  EXPECT_FALSE(capped.materialize(many.files(), "t", why));
  EXPECT_NE(why.find("at most 2"), std::string::npos) << why;
  EXPECT_TRUE(tmp.entries().empty());
}

TEST(TaskFiles, SpecPathsMoveToTheDirectoryAndBack) {
  capnp::MallocMessageBuilder msg;
  auto spec = msg.initRoot<schema::KernelSpec>();
  spec.setSourcePath("/state/submissions/1/task/mm");
  spec.setBaselinePath("/state/submissions/1/task/mm/optimized.py");
  fill(spec.initTaskFiles(1), {{"baseline.py", "x"}});
  tpu_nodes::localize_spec(spec, "/tmp/maxkernel-tasks-1/ab/mm");
  EXPECT_EQ(std::string(spec.getSourcePath().cStr()), "/tmp/maxkernel-tasks-1/ab/mm");
  EXPECT_EQ(std::string(spec.getBaselinePath().cStr()), "/tmp/maxkernel-tasks-1/ab/mm/optimized.py");
  EXPECT_FALSE(spec.hasTaskFiles());  // the worker reads the directory
  tpu_nodes::restore_spec_paths(spec, "/tmp/maxkernel-tasks-1/ab/mm", "/state/submissions/1/task/mm");
  EXPECT_EQ(std::string(spec.getSourcePath().cStr()), "/state/submissions/1/task/mm");
  EXPECT_EQ(std::string(spec.getBaselinePath().cStr()), "/state/submissions/1/task/mm/optimized.py");
  // A path only sharing a prefix is not inside the directory.
  spec.setBaselinePath("/state/submissions/1/task/mmx/optimized.py");
  tpu_nodes::localize_spec(spec, "/tmp/d");
  EXPECT_EQ(std::string(spec.getBaselinePath().cStr()), "/state/submissions/1/task/mmx/optimized.py");
}

// ---------------------------------------------------------------- through a tpu_node

namespace {

// What the stand-in pool was asked.
struct pool_log {
  std::vector<std::string> eval_paths;     // spec.sourcePath of each evaluation
  std::vector<bool> eval_had_files;        // whether the spec still carried taskFiles
  std::vector<std::string> eval_baselines; // baseline.py as read from sourcePath
  std::vector<std::string> analyze_paths;
  std::vector<std::string> load_paths;
};

messages::worker_pool_actor::behavior_type stand_in_pool(messages::worker_pool_actor::pointer,
                                                         std::shared_ptr<pool_log> log) {
  return {
    [log](messages::evaluate_atom, payload& p, uint32_t) -> caf::result<payload> {
      std::string err;
      auto msg = messages::open_payload<schema::EvalRequest>(p, err);
      if (!msg)
        return messages::make_error(messages::error_code::malformed_message, err);
      auto spec = msg->root<schema::EvalRequest>().getSpec();
      log->eval_paths.emplace_back(spec.getSourcePath().cStr());
      log->eval_had_files.push_back(spec.hasTaskFiles());
      log->eval_baselines.push_back(read_file(fs::path(spec.getSourcePath().cStr()) / "baseline.py"));
      capnp::MallocMessageBuilder out;
      auto r = out.initRoot<schema::EvalResult>();
      r.setSchemaVersion(schema::SCHEMA_VERSION);
      r.setCorrect(true);
      return messages::make_payload<schema::EvalResult>(out);
    },
    [log](messages::load_atom, std::string& path, uint32_t) -> caf::result<payload> {
      log->load_paths.push_back(path);
      if (!fs::exists(fs::path(path) / "baseline.py"))
        return messages::make_error(messages::error_code::bad_input, path + ": no baseline.py");
      capnp::MallocMessageBuilder out;
      auto spec = out.initRoot<schema::KernelSpec>();
      spec.setSchemaVersion(schema::SCHEMA_VERSION);
      spec.setName(fs::path(path).filename().string());
      spec.setSourcePath(path);
      spec.setBaselinePath(path + "/optimized.py");
      return messages::make_payload<schema::KernelSpec>(out);
    },
    [log](messages::analyze_atom, payload& p, uint32_t) -> caf::result<payload> {
      std::string err;
      auto msg = messages::open_payload<schema::AnalyzeRequest>(p, err);
      if (!msg)
        return messages::make_error(messages::error_code::malformed_message, err);
      log->analyze_paths.emplace_back(msg->root<schema::AnalyzeRequest>().getSpec().getSourcePath().cStr());
      return p;
    },
    [](messages::info_atom) -> caf::result<payload> {
      capnp::MallocMessageBuilder out;
      out.initRoot<schema::NodeInfo>().setSchemaVersion(schema::SCHEMA_VERSION);
      return messages::make_payload<schema::NodeInfo>(out);
    },
    [](messages::version_atom) -> caf::result<std::string, std::string> {
      return {std::string("0.4.test"), std::string("model")};
    },
  };
}

// An EvalRequest whose spec is a task directory at `source` shipped with `files`.
payload shipped_request(const std::string& source, const file_list& files,
                        const std::string& candidate) {
  auto base = test_support::eval_request(candidate);
  std::string err;
  auto msg = messages::open_payload<schema::EvalRequest>(base, err);
  capnp::MallocMessageBuilder copy;
  copy.setRoot(msg->root<schema::EvalRequest>());
  auto spec = copy.getRoot<schema::EvalRequest>().getSpec();
  spec.setFormat(schema::SpecFormat::JAXBENCH);
  spec.setSourcePath(source);
  fill(spec.initTaskFiles(static_cast<unsigned>(files.size())), files);
  return messages::make_payload<schema::EvalRequest>(copy);
}

class ShippedTask : public ::testing::Test {
protected:
  void SetUp() override {
    store = search::evaluation_store::open((tmp.path / "store.sqlite").string(), err);
    ASSERT_TRUE(store) << err;
    shipped = std::make_unique<tpu_nodes::task_files>((tmp.path / "node-tmp").string());
    fs::create_directory(tmp.path / "node-tmp");
    pool = env.sys.spawn(stand_in_pool, log);
    tpu_nodes::node_config cfg;
    cfg.node_id = "test:0";
    cfg.store = store.get();
    cfg.shipped = shipped.get();
    node = tpu_nodes::spawn_tpu_node(env.sys, cfg, pool);
    env.run_messages();  // the node learns the JAX version
  }

  void TearDown() override {
    env.self->send_exit(node, caf::exit_reason::user_shutdown);
    env.self->send_exit(pool, caf::exit_reason::user_shutdown);
    env.run_messages();
  }

  // Sends and runs; the reply's payload, or the error's message in `error`.
  template <class... Ts>
  std::optional<payload> ask(std::string& error, Ts... args) {
    env.self->send(node, args...);
    env.run_messages();
    std::optional<payload> value;
    bool arrived = env.receive_now([&](payload& p) { value = std::move(p); },
                                   [&](caf::error& e) { error = messages::message_of(e); });
    EXPECT_TRUE(arrived);
    return value;
  }

  scratch tmp;
  std::string err;
  std::unique_ptr<search::evaluation_store> store;
  std::unique_ptr<tpu_nodes::task_files> shipped;
  std::shared_ptr<pool_log> log = std::make_shared<pool_log>();
  test_support::deterministic_system env;
  messages::worker_pool_actor pool;
  messages::tpu_node_actor node;
};

}  // namespace

TEST_F(ShippedTask, EvaluationsReadTheWrittenDirectoryUnderTheRequestersKey) {
  const std::string supervisor_path = "/nonexistent/state/submissions/1-0000/task/jaxbench_matmul";
  auto first = shipped_request(supervisor_path, jaxbench, "def workload(a, b): return a @ b\n");
  auto second = shipped_request(supervisor_path, jaxbench, "def workload(a, b): return b @ a\n");
  std::string error;
  auto r1 = ask(error, messages::evaluate_atom::value, first);
  ASSERT_TRUE(r1) << error;
  auto r2 = ask(error, messages::evaluate_atom::value, second);
  ASSERT_TRUE(r2) << error;

  ASSERT_EQ(log->eval_paths.size(), 2u);
  EXPECT_EQ(log->eval_paths[0], log->eval_paths[1]);  // written once, used twice
  EXPECT_EQ(shipped->written(), 1u);
  EXPECT_EQ(fs::path(log->eval_paths[0]).parent_path().parent_path(), fs::path(shipped->root()));
  EXPECT_EQ(fs::path(log->eval_paths[0]).filename(), "jaxbench_matmul");
  EXPECT_FALSE(log->eval_had_files[0]);  // the worker is not sent the files again
  EXPECT_EQ(log->eval_baselines[0], "CONFIG = {}\n");

  // The key is the request's as the supervisor sent it (its path), not the node's directory.
  auto msg = messages::open_payload<schema::EvalRequest>(first, err);
  auto expected = tpu_nodes::request_key(msg->root<schema::EvalRequest>(), "v6e", "model",
                                         "0.4.test", tpu_nodes::evaluator_revision("model", "v6e"));
  auto result = messages::open_payload<schema::EvalResult>(*r1, err);
  ASSERT_TRUE(result) << err;
  EXPECT_EQ(std::string(result->root<schema::EvalResult>().getKey().cStr()), expected);
  EXPECT_TRUE(store->find(expected).has_value());

  // A repeat is answered from the store, without the pool.
  auto r3 = ask(error, messages::evaluate_atom::value, first);
  ASSERT_TRUE(r3) << error;
  EXPECT_EQ(log->eval_paths.size(), 2u);
}

TEST_F(ShippedTask, ALoadWithFilesIsReadHereAndAnsweredWithTheRequestersPaths) {
  const std::string supervisor_path = "/nonexistent/state/submissions/1-0000/task/jaxbench_matmul";
  capnp::MallocMessageBuilder msg;
  auto load = msg.initRoot<schema::LoadRequest>();
  load.setPath(supervisor_path);
  fill(load.initTaskFiles(static_cast<unsigned>(jaxbench.size())), jaxbench);
  std::string error;
  auto reply = ask(error, messages::load_atom::value, messages::make_payload<schema::LoadRequest>(msg));
  ASSERT_TRUE(reply) << error;
  ASSERT_EQ(log->load_paths.size(), 1u);
  EXPECT_NE(log->load_paths[0], supervisor_path);
  EXPECT_EQ(fs::path(log->load_paths[0]).parent_path().parent_path(), fs::path(shipped->root()));
  auto spec = messages::open_payload<schema::KernelSpec>(*reply, err);
  ASSERT_TRUE(spec) << err;
  auto s = spec->root<schema::KernelSpec>();
  EXPECT_EQ(std::string(s.getName().cStr()), "jaxbench_matmul");
  EXPECT_EQ(std::string(s.getSourcePath().cStr()), supervisor_path);
  EXPECT_EQ(std::string(s.getBaselinePath().cStr()), supervisor_path + "/optimized.py");

  // An analysis of the same task reads the same directory.
  capnp::MallocMessageBuilder am;
  auto analyze = am.initRoot<schema::AnalyzeRequest>();
  auto aspec = analyze.initSpec();
  aspec.setSchemaVersion(schema::SCHEMA_VERSION);
  aspec.setSourcePath(supervisor_path);
  fill(aspec.initTaskFiles(static_cast<unsigned>(jaxbench.size())), jaxbench);
  ASSERT_TRUE(ask(error, messages::analyze_atom::value, messages::make_payload<schema::AnalyzeRequest>(am)))
    << error;
  ASSERT_EQ(log->analyze_paths.size(), 1u);
  EXPECT_EQ(log->analyze_paths[0], log->load_paths[0]);
  EXPECT_EQ(shipped->written(), 1u);
}

TEST_F(ShippedTask, AHostileShipmentIsBadInputAndWritesNothing) {
  capnp::MallocMessageBuilder msg;
  auto load = msg.initRoot<schema::LoadRequest>();
  load.setPath("/somewhere/task");
  fill(load.initTaskFiles(2), {{"baseline.py", "x"}, {"../../../etc/cron.d/evil", "x"}});
  env.self->send(node, messages::load_atom::value, messages::make_payload<schema::LoadRequest>(msg));
  env.run_messages();
  caf::error error;
  ASSERT_TRUE(env.receive_now([](payload&) {}, [&](caf::error& e) { error = e; }));
  EXPECT_EQ(messages::code_of(error), messages::error_code::bad_input);
  EXPECT_NE(messages::message_of(error).find("../../../etc/cron.d/evil"), std::string::npos)
    << messages::message_of(error);
  EXPECT_TRUE(log->load_paths.empty());
  EXPECT_TRUE(fs::is_empty(tmp.path / "node-tmp"));

  std::string why;
  auto bad_eval = shipped_request("/somewhere/task", {{"/etc/passwd", "x"}}, "def workload(): pass\n");
  EXPECT_FALSE(ask(why, messages::evaluate_atom::value, bad_eval));
  EXPECT_NE(why.find("absolute"), std::string::npos) << why;
  EXPECT_TRUE(log->eval_paths.empty());
}

TEST_F(ShippedTask, RequestsWithoutFilesReachThePoolUnchanged) {
  // One process (the embedded run): no copy, the spec's own path.
  auto request = test_support::eval_request("def workload(a, b): return a @ b\n");
  std::string error;
  ASSERT_TRUE(ask(error, messages::evaluate_atom::value, request)) << error;
  ASSERT_EQ(log->eval_paths.size(), 1u);
  EXPECT_EQ(log->eval_paths[0], "");
  EXPECT_EQ(shipped->root(), "");  // nothing made
  ASSERT_TRUE(ask(error, messages::load_atom::value, (tmp.path / "nowhere").string()) || !error.empty());
  ASSERT_EQ(log->load_paths.size(), 1u);
  EXPECT_EQ(log->load_paths[0], (tmp.path / "nowhere").string());
}
