#include "cli/task_session.hpp"

#include "config/chip_loader.hpp"

#include <iostream>

namespace maxkernel::cli {

int open_task_session(const std::string& spec_path, spec_kind kind, const session_flags& flags,
                      task_session& out) {
  std::string error;
  spec_outcome loaded;
  session_options sopts;
  sopts.chip = flags.chip;
  if (kind == spec_kind::native) {
    loaded = load_spec(spec_path, kind, flags.chip, flags.memory_limit_bytes, {});
    if (loaded.exit_code != 0) {
      std::cerr << "error: " << loaded.error << "\n";
      return loaded.exit_code;
    }
    if (sopts.chip.empty()) {
      auto m = messages::decode<schema::KernelSpec>(loaded.spec_bytes, error);
      sopts.chip = m->root<schema::KernelSpec>().getChip().cStr();
    }
  }
  sopts.state_dir = flags.state_dir;
  sopts.use_store = !flags.no_store;
  sopts.simulate_device = std::chrono::milliseconds(flags.simulate_device_ms);
  sopts.memory_limit_bytes = flags.memory_limit_bytes;
  sopts.deadline = std::chrono::milliseconds(static_cast<int64_t>(flags.deadline_seconds * 1000));
  sopts.nodes = flags.nodes;
  sopts.workers = flags.workers;
  sopts.dispatch = flags.dispatch;
  out.session = std::make_unique<node_session>(sopts);
  if (!out.session->start(error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  if (kind != spec_kind::native) {
    int code = load_task_spec(*out.session, spec_path, kind, flags.chip, flags.memory_limit_bytes,
                              out.spec_message, error);
    if (code)
      std::cerr << "error: " << error << "\n";
    return code;
  }
  out.spec_message = messages::decode<schema::KernelSpec>(loaded.spec_bytes, error);
  if (!out.spec_message) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return 0;
}

int load_task_spec(node_session& session, const std::string& spec_path, spec_kind kind,
                   const std::string& chip_flag, uint64_t memory_limit_bytes,
                   std::optional<messages::decoded_message>& spec, std::string& error) {
  auto loaded = load_spec(spec_path, kind, chip_flag, memory_limit_bytes,
                          [&session](const std::string& path) {
                            auto a = session.load_task(path);
                            return spec_outcome{a.exit_code, a.error, a.bytes};
                          });
  if (loaded.exit_code != 0) {
    error = loaded.error;
    return loaded.exit_code;
  }
  spec = messages::decode<schema::KernelSpec>(loaded.spec_bytes, error);
  return spec ? 0 : 3;
}

int task_chip(const std::string& flag, schema::KernelSpec::Reader spec, std::string& chip_name,
              std::string& error) {
  chip_name = flag.empty() ? spec.getChip().cStr() : flag;
  config::chip chip;
  config::spec_error why;
  if (!config::load_chip(chip_name, chip, why)) {
    error = "chip: " + why.what();
    return 2;
  }
  return 0;
}

int task_chip(const std::string& flag, schema::KernelSpec::Reader spec, std::string& chip_name) {
  std::string error;
  int code = task_chip(flag, spec, chip_name, error);
  if (code)
    std::cerr << "error: " << error << "\n";
  return code;
}

}  // namespace maxkernel::cli
