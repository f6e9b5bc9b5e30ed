// Benchmark (not a test): TPU model evaluations per second on one core. The kernel's
// structure and the reference's graph are traced once by a real worker, then priced in a
// loop on a chip from config/chips. Run through scripts/bench-model.
#include "config/chip_loader.hpp"
#include "config/native_spec_loader.hpp"
#include "maxkernel/schema/eval.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/eval_request.hpp"
#include "tpu_nodes/model/tpu_model.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/message.h>
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

using namespace maxkernel;
using clock_type = std::chrono::steady_clock;

namespace {

template <class F>
double rate(uint64_t n, F&& f) {
  auto t0 = clock_type::now();
  for (uint64_t i = 0; i < n; ++i)
    f();
  return static_cast<double>(n) / std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: bench_model SPEC.yaml KERNEL.py CHIP [EVALUATIONS]\n";
    return 2;
  }
  uint64_t n = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 200'000;
  capnp::MallocMessageBuilder spec_msg;
  auto spec = spec_msg.initRoot<schema::KernelSpec>();
  config::spec_error err;
  if (!config::load_native_spec(argv[1], {}, spec, err)) {
    std::cerr << err.what() << "\n";
    return 2;
  }
  config::chip chip;
  if (!config::load_chip(argv[3], chip, err)) {
    std::cerr << err.what() << "\n";
    return 2;
  }
  std::ifstream in(argv[2]);
  std::stringstream source;
  source << in.rdbuf();

  tpu_nodes::worker_client worker(tpu_nodes::worker_options::defaults());
  std::string error;
  if (!worker.start(error)) {
    std::cerr << error << "\n";
    return 3;
  }
  capnp::MallocMessageBuilder request_msg;
  auto request = request_msg.initRoot<schema::EvalRequest>();
  messages::request_settings settings;
  settings.chip = argv[3];
  messages::build_eval_request(request, spec.asReader(), source.str(), argv[2], settings);
  auto extracted = worker.evaluate(tpu_nodes::eval_kind::extract, request.asReader(),
                                   std::chrono::minutes(5));
  auto graph = worker.analyze(spec.asReader(), 0, std::chrono::minutes(5));
  auto result = extracted.ok ? messages::decode<schema::EvalResult>(extracted.bytes, error)
                             : std::nullopt;
  if (!result || !result->root<schema::EvalResult>().getHasStructure() || !graph.ok) {
    std::cerr << "cannot trace the kernel or the reference: " << error << extracted.message
              << graph.message << "\n";
    return 3;
  }
  // The loops re-read one message each, beyond any per-reader traversal limit.
  auto structure = messages::decode<schema::KernelStructure>(
      messages::encode_root(result->root<schema::EvalResult>().getStructure()), error);
  auto reference = messages::decode<schema::DataflowGraph>(graph.bytes, error);
  if (!structure || !reference) {
    std::cerr << "bad traced message: " << error << "\n";
    return 3;
  }
  structure->allow_rereading();
  reference->allow_rereading();
  auto kernel_root = structure->root<schema::KernelStructure>();
  auto graph_root = reference->root<schema::DataflowGraph>();

  double modeled_us = 0;
  double kernel_rate = rate(n, [&] {
    capnp::MallocMessageBuilder profile;
    modeled_us = tpu_nodes::model::price_kernel(kernel_root, chip,
                                                profile.initRoot<schema::Profile>())
                   .time_us;
  });
  double reference_rate = rate(n, [&] {
    capnp::MallocMessageBuilder profile;
    tpu_nodes::model::price_xla(graph_root, chip, profile.initRoot<schema::Profile>());
  });
  fmt::print("bench_model: {} on {}: price_kernel {:.0f} evaluations/s, price_xla (reference, "
             "{} nodes) {:.0f} evaluations/s, one core, {} each; kernel modeled at {:.2f} us\n",
             spec.getName().cStr(), chip.name, kernel_rate, graph_root.getNodes().size(),
             reference_rate, n, modeled_us);
  return 0;
}
