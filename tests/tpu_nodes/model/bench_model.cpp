// Benchmark (not a test): TPU model evaluations per second on one core. The kernel's
// structure and the reference's graph are traced once by a real worker, then priced in a
// loop on a chip from config/chips. Run through scripts/bench-model.
#include "config/chip_loader.hpp"
#include "config/native_spec_loader.hpp"
#include "maxkernel/schema/eval.capnp.h"
#include "messages/capnp_io.hpp"
#include "tpu_nodes/model/tpu_model.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

using namespace maxkernel;
using clock_type = std::chrono::steady_clock;

namespace {

// A reader that may be traversed any number of times (the loop re-reads one message).
struct reusable {
  kj::Array<capnp::word> words;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader;
  explicit reusable(const std::string& bytes)
      : words(kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word))) {
    std::memcpy(words.begin(), bytes.data(), words.size() * sizeof(capnp::word));
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = std::numeric_limits<uint64_t>::max();
    reader = std::make_unique<capnp::FlatArrayMessageReader>(words.asPtr(), opts);
  }
};

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
  request.setSchemaVersion(schema::SCHEMA_VERSION);
  request.setSpec(spec.asReader());
  request.initCandidate().setSource(source.str());
  request.initOptions().setChip(argv[3]);
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
  reusable structure(messages::encode_root(result->root<schema::EvalResult>().getStructure()));
  reusable reference(graph.bytes);
  auto kernel_root = structure.reader->getRoot<schema::KernelStructure>();
  auto graph_root = reference.reader->getRoot<schema::DataflowGraph>();

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
