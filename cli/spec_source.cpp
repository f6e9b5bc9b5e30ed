#include "cli/spec_source.hpp"

#include "config/native_spec_loader.hpp"
#include "messages/capnp_io.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/message.h>

#include <filesystem>

namespace maxkernel::cli {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {
constexpr const char* default_chip = "v6e";
constexpr auto load_deadline = 120s;
}

spec_kind classify_spec(const std::string& path, std::string& error) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    error = path + ": no such file or directory";
    return spec_kind::invalid;
  }
  if (fs::is_directory(status)) {
    if (fs::exists(fs::path(path) / "baseline.py"))
      return spec_kind::jaxbench;
    if (fs::exists(fs::path(path) / "kernel_task.yaml"))
      return spec_kind::maxkernel;
    error = path + ": a task directory must hold baseline.py (JAXBench) or kernel_task.yaml "
                   "(MaxKernel)";
    return spec_kind::invalid;
  }
  auto ext = fs::path(path).extension().string();
  if (ext == ".yaml" || ext == ".yml")
    return spec_kind::native;
  error = path + ": a spec is a .yaml file or a task directory";
  return spec_kind::invalid;
}

task_loader worker_task_loader(tpu_nodes::worker_client& worker, uint64_t memory_limit_bytes) {
  return [&worker, memory_limit_bytes](const std::string& path) {
    spec_outcome out;
    auto loaded = worker.load_task(path, memory_limit_bytes, load_deadline);
    if (!loaded.ok) {
      bool bad = loaded.error_class == schema::ErrorClass::BAD_INPUT
                 || loaded.error_class == schema::ErrorClass::TOO_LARGE;
      out.exit_code = bad ? 2 : 3;
      out.error = loaded.message;
      // Loading runs the task's own code: past the deadline, that code is what hangs.
      if (loaded.error_class == schema::ErrorClass::TIMEOUT) {
        out.exit_code = 2;
        out.error = path + ": the task's code did not finish within "
                    + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(load_deadline).count())
                    + " s (does create_inputs, get_inputs or the reference loop forever?)";
      } else if (loaded.error_class == schema::ErrorClass::CRASH) {
        // The worker ran nothing but this task's code: os._exit, a crash, the memory limit.
        out.exit_code = 2;
        out.error = path + ": running the task's code: " + loaded.message
                    + "; does it call os._exit or exhaust memory?";
      }
      return out;
    }
    out.spec_bytes = std::move(loaded.bytes);
    return out;
  };
}

spec_outcome load_spec(const std::string& path, spec_kind kind, const std::string& chip_override,
                       uint64_t memory_limit_bytes, const task_loader& load_task) {
  spec_outcome out;
  capnp::MallocMessageBuilder msg;
  auto spec = msg.initRoot<schema::KernelSpec>();
  if (kind == spec_kind::native) {
    config::spec_error err;
    config::spec_load_options opts;
    opts.chip_override = chip_override;
    opts.memory_limit_bytes = memory_limit_bytes;
    if (!config::load_native_spec(path, opts, spec, err)) {
      out.exit_code = 2;
      out.error = err.what();
      return out;
    }
  } else {
    auto loaded = load_task(fs::absolute(path).string());
    if (loaded.exit_code != 0)
      return loaded;
    std::string err;
    auto decoded = messages::decode<schema::KernelSpec>(loaded.spec_bytes, err);
    if (!decoded) {
      out.exit_code = 3;
      out.error = "the worker sent a bad spec: " + err;
      return out;
    }
    msg.setRoot(decoded->root<schema::KernelSpec>());
    spec = msg.getRoot<schema::KernelSpec>();
  }
  if (!chip_override.empty())
    spec.setChip(chip_override);
  else if (spec.getChip().size() == 0)
    spec.setChip(default_chip);
  out.spec_bytes = messages::encode(msg);
  return out;
}

}  // namespace maxkernel::cli
