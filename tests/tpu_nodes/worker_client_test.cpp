// The C++ worker client against the real Python worker (real JAX on the CPU): round trips,
// classified failures, and a worker that survives hanging and crashing candidates.
#include "maxkernel/schema/eval.capnp.h"
#include "messages/capnp_io.hpp"
#include "tpu_nodes/oom_kill_log.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/message.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

using namespace maxkernel;
using namespace std::chrono_literals;
using tpu_nodes::eval_kind;

namespace {

const char* reference_source = R"(
import jax.numpy as jnp
def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)
)";

const char* matmul_source = R"(
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
def kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)
def workload(x, y):
    m, k = x.shape
    n = y.shape[1]
    b = 128
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // b, n // b, k // b),
        in_specs=[pl.BlockSpec((b, b), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((b, b), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((b, b), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")))(x, y)
)";

class WorkerClient : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    client = std::make_unique<tpu_nodes::worker_client>(tpu_nodes::worker_options::defaults());
    std::string error;
    ASSERT_TRUE(client->start(error)) << error;
  }
  static void TearDownTestSuite() {
    client.reset();
  }

  // An EvalRequest for a 256x256 bf16 matmul spec and the given candidate source.
  std::string request(const std::string& source) {
    capnp::MallocMessageBuilder msg;
    auto req = msg.initRoot<schema::EvalRequest>();
    req.setSchemaVersion(schema::SCHEMA_VERSION);
    auto spec = req.initSpec();
    spec.setSchemaVersion(schema::SCHEMA_VERSION);
    spec.setName("matmul_small");
    spec.setFormat(schema::SpecFormat::NATIVE);
    spec.setReference(reference_source);
    spec.setReferenceEntry("reference");
    spec.setChip("v6e");
    auto tol = spec.initTolerances(1)[0];
    tol.setOutput(-1);
    tol.setAtol(2e-2);
    tol.setRtol(2e-2);
    auto cfg = spec.initConfigurations(1)[0];
    cfg.setName("default");
    auto inputs = cfg.initInputs(2);
    const char* names[] = {"x", "y"};
    for (unsigned i = 0; i < 2; ++i) {
      inputs[i].setName(names[i]);
      auto type = inputs[i].initType();
      type.setDtype("bfloat16");
      auto shape = type.initShape(2);
      shape.set(0, 256);
      shape.set(1, 256);
      inputs[i].initGenerator().initNormal().setStd(1.0);
    }
    auto cand = req.initCandidate();
    cand.setSchemaVersion(schema::SCHEMA_VERSION);
    cand.setId(std::to_string(std::hash<std::string>{}(source)));
    cand.setSource(source);
    req.initOptions().setFull(true);
    return messages::encode(msg);
  }

  tpu_nodes::worker_result evaluate(eval_kind kind, const std::string& source,
                                    std::chrono::milliseconds deadline = 300s) {
    auto bytes = request(source);
    std::string err;
    auto msg = messages::decode<schema::EvalRequest>(bytes, err);
    EXPECT_TRUE(msg) << err;
    return client->evaluate(kind, msg->root<schema::EvalRequest>(), deadline);
  }

  static schema::PhaseResult::Reader last_phase(messages::decoded_message& msg) {
    auto phases = msg.root<schema::EvalResult>().getPhases();
    return phases[phases.size() - 1];
  }

  static std::unique_ptr<tpu_nodes::worker_client> client;
};

std::unique_ptr<tpu_nodes::worker_client> WorkerClient::client;

}  // namespace

TEST_F(WorkerClient, DescribesItselfAndItsSandbox) {
  auto& d = client->description();
  EXPECT_GT(d.pid, 0);
  EXPECT_EQ(d.jax_version, "0.10.2");
  EXPECT_EQ(d.platform, "cpu");
  EXPECT_FALSE(d.sandbox.empty());
}

TEST_F(WorkerClient, CorrectMatmulLowersAndPasses) {
  auto lowered = evaluate(eval_kind::lower, matmul_source);
  ASSERT_TRUE(lowered.ok) << lowered.message;
  std::string err;
  auto msg = messages::decode<schema::EvalResult>(lowered.bytes, err);
  ASSERT_TRUE(msg) << err;
  EXPECT_EQ(last_phase(*msg).getStatus(), schema::Status::OK) << last_phase(*msg).getMessage().cStr();

  auto tested = evaluate(eval_kind::test, matmul_source);
  ASSERT_TRUE(tested.ok) << tested.message;
  auto tmsg = messages::decode<schema::EvalResult>(tested.bytes, err);
  ASSERT_TRUE(tmsg) << err;
  auto result = tmsg->root<schema::EvalResult>();
  EXPECT_TRUE(result.getCorrect()) << last_phase(*tmsg).getMessage().cStr();
  EXPECT_GE(result.getTest().getCases().size(), 2u);
}

TEST_F(WorkerClient, BadBlockShapeIsRefusedAtLowering) {
  std::string source = matmul_source;
  auto pos = source.find("b = 128");
  source.replace(pos, 7, "b = 100");
  auto lowered = evaluate(eval_kind::lower, source);
  ASSERT_TRUE(lowered.ok) << lowered.message;
  std::string err;
  auto msg = messages::decode<schema::EvalResult>(lowered.bytes, err);
  ASSERT_TRUE(msg) << err;
  auto phase = last_phase(*msg);
  EXPECT_EQ(phase.getStatus(), schema::Status::FAILED);
  EXPECT_EQ(phase.getErrorClass(), schema::ErrorClass::LOWER_BLOCK_SHAPE)
    << phase.getMessage().cStr();
}

TEST_F(WorkerClient, HangingCandidateTimesOutAndWorkerServesNext) {
  auto restarts = client->restarts();
  auto hung = evaluate(eval_kind::lower, "import time\ntime.sleep(3600)\ndef workload(x, y):\n  return x\n",
                       3s);
  ASSERT_TRUE(hung.ok) << hung.message;
  std::string err;
  auto msg = messages::decode<schema::EvalResult>(hung.bytes, err);
  ASSERT_TRUE(msg) << err;
  EXPECT_EQ(last_phase(*msg).getErrorClass(), schema::ErrorClass::TIMEOUT);
  EXPECT_EQ(client->restarts(), restarts + 1);
  EXPECT_TRUE(client->ping(60s).ok);
}

TEST_F(WorkerClient, CrashingCandidateIsClassifiedAndWorkerServesNext) {
  auto crashed = evaluate(eval_kind::lower, "import os\nos._exit(7)\n");
  ASSERT_TRUE(crashed.ok) << crashed.message;
  std::string err;
  auto msg = messages::decode<schema::EvalResult>(crashed.bytes, err);
  ASSERT_TRUE(msg) << err;
  EXPECT_EQ(last_phase(*msg).getErrorClass(), schema::ErrorClass::CRASH);
  EXPECT_NE(std::string(last_phase(*msg).getMessage().cStr()).find("exit code 7"), std::string::npos);
  auto again = evaluate(eval_kind::lower, matmul_source);
  ASSERT_TRUE(again.ok) << again.message;
  auto amsg = messages::decode<schema::EvalResult>(again.bytes, err);
  EXPECT_EQ(last_phase(*amsg).getStatus(), schema::Status::OK);
}

TEST(OomKillLog, ReadsTheKernelsRecordOfTheProcess) {
  const char* cgroup = "3,480,47169851219,-;Memory cgroup out of memory: Killed process 23313 "
                       "(python3) total-vm:528568kB, anon-rss:211200kB";
  const char* host = "3,12,5,-;Out of memory: Killed process 23313 (python) total-vm:1kB";
  EXPECT_TRUE(tpu_nodes::oom_kill_recorded(cgroup, 23313));
  EXPECT_TRUE(tpu_nodes::oom_kill_recorded(host, 23313));
  EXPECT_FALSE(tpu_nodes::oom_kill_recorded(cgroup, 2331));   // another pid's record
  EXPECT_FALSE(tpu_nodes::oom_kill_recorded(cgroup, 233130));
  EXPECT_FALSE(tpu_nodes::oom_kill_recorded("6,1,2,-;Killed process 23313 (x) by hand", 23313));
  EXPECT_FALSE(tpu_nodes::oom_kill_recorded("", 23313));
}

// A candidate that runs the worker out of memory (here its memory cgroup's limit, on a host
// the machine's) is killed by the kernel's OOM killer with SIGKILL: reported as a resource
// limit, not a crash, and the worker is restarted. Needs root (a memory cgroup, /dev/kmsg).
TEST_F(WorkerClient, AWorkerTheOomKillerEndsIsAResourceLimit) {
  namespace fs = std::filesystem;
  fs::path group = fs::path("/sys/fs/cgroup/memory") / ("maxkernel-oom-test-" + std::to_string(::getpid()));
  int kmsg = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK);
  std::error_code ec;
  if (kmsg < 0 || !fs::create_directory(group, ec)) {
    if (kmsg >= 0)
      ::close(kmsg);
    GTEST_SKIP() << "needs a writable v1 memory cgroup and a readable /dev/kmsg";
  }
  ::close(kmsg);
  auto pid = client->description().pid;
  {
    std::ofstream(group / "memory.limit_in_bytes") << (768ull << 20);
    std::ofstream(group / "cgroup.procs") << pid;
  }
  auto restarts = client->restarts();
  // 2 GiB touched at import: past the cgroup's 768 MiB, within the worker's data limit.
  auto hog = evaluate(eval_kind::lower, "hoard = bytearray(2 << 30)\ndef workload(x, y):\n  return x\n");
  fs::remove(group, ec);
  ASSERT_TRUE(hog.ok) << hog.message;
  std::string err;
  auto msg = messages::decode<schema::EvalResult>(hog.bytes, err);
  ASSERT_TRUE(msg) << err;
  std::string text = last_phase(*msg).getMessage().cStr();
  EXPECT_EQ(last_phase(*msg).getErrorClass(), schema::ErrorClass::RESOURCE_LIMIT) << text;
  EXPECT_NE(text.find("out-of-memory killer"), std::string::npos) << text;
  EXPECT_EQ(client->restarts(), restarts + 1);
  EXPECT_TRUE(client->ping(60s).ok);
}
