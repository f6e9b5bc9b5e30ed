// Benchmark (not a test): latency of the worker's requests for a 1024x1024 bf16 matmul, cold
// (first request of a fresh worker) and warm (median and p95 of repeats), and the worker's
// resident memory. Run through scripts/bench-worker.
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/kernel_spec.capnp.h"
#include "messages/capnp_io.hpp"
#include "messages/eval_request.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/message.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

using namespace maxkernel;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_of(const std::function<bool()>& f, bool& ok) {
  auto t0 = clock_type::now();
  ok = f();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string status_field(long pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0)
      return line.substr(field.size() + 1);
  return "?";
}

bool eval_ok(const tpu_nodes::worker_result& r) {
  if (!r.ok)
    return false;
  std::string err;
  auto msg = messages::decode<schema::EvalResult>(r.bytes, err);
  if (!msg)
    return false;
  for (auto p : msg->root<schema::EvalResult>().getPhases())
    if (p.getStatus() == schema::Status::FAILED) {
      std::cerr << "phase failed: " << p.getMessage().cStr() << "\n";
      return false;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: bench_worker TASK_DIR KERNEL.py [REPEATS]\n";
    return 2;
  }
  std::string task_dir = argv[1], kernel = argv[2];
  int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 10;

  tpu_nodes::worker_client client(tpu_nodes::worker_options::defaults());
  std::string error;
  bool ok = false;
  double start_s = seconds_of([&] { return client.start(error); }, ok);
  if (!ok) {
    std::cerr << error << "\n";
    return 3;
  }
  auto pid = client.description().pid;
  std::cerr << fmt::format("worker pid {} started in {:.2f} s (sandbox: {} protections)\n", pid,
                           start_s, client.description().sandbox.size());

  std::string spec_bytes;
  auto load = [&] {
    auto r = client.load_task(task_dir, 8ull << 30, 300s);
    if (r.ok)
      spec_bytes = r.bytes;
    else
      std::cerr << "load: " << r.message << "\n";
    return r.ok;
  };
  // The first load happens before the request builders below need the spec.
  struct row {
    std::string name;
    double cold = 0;
    std::vector<double> warm;
  };
  std::vector<row> rows;
  rows.push_back({"load", seconds_of(load, ok)});
  if (!ok)
    return 3;

  std::string err;
  auto spec_msg = messages::decode<schema::KernelSpec>(spec_bytes, err);
  auto spec = spec_msg->root<schema::KernelSpec>();
  capnp::MallocMessageBuilder req_msg;
  auto req = req_msg.initRoot<schema::EvalRequest>();
  messages::request_settings settings;
  settings.chip = "v6e";
  messages::build_eval_request(req, spec, read_file(kernel), kernel, settings);
  auto request = req.asReader();

  std::vector<std::pair<std::string, std::function<bool()>>> steps = {
    {"analyze", [&] { return client.analyze(spec, 0, 300s).ok; }},
    {"lower", [&] { return eval_ok(client.evaluate(tpu_nodes::eval_kind::lower, request, 300s)); }},
    {"extract",
     [&] { return eval_ok(client.evaluate(tpu_nodes::eval_kind::extract, request, 300s)); }},
    {"test", [&] { return eval_ok(client.evaluate(tpu_nodes::eval_kind::test, request, 900s)); }},
  };
  for (auto& [name, f] : steps) {
    rows.push_back({name, seconds_of(f, ok)});
    if (!ok) {
      std::cerr << name << " failed\n";
      return 1;
    }
  }
  // Warm repeats. A candidate with a new id each time would defeat the worker's module cache;
  // the same candidate is what a search re-submits, so the cache is part of what is measured.
  for (int i = 0; i < repeats; ++i) {
    rows[0].warm.push_back(seconds_of(load, ok));
    for (size_t s = 0; s < steps.size(); ++s)
      rows[s + 1].warm.push_back(seconds_of(steps[s].second, ok));
  }
  std::cout << fmt::format("{:<8} {:>10} {:>12} {:>10}\n", "request", "cold ms", "warm p50 ms",
                           "warm p95 ms");
  for (auto& r : rows) {
    std::sort(r.warm.begin(), r.warm.end());
    auto pct = [&](double q) {
      size_t i = std::min(r.warm.size() - 1, static_cast<size_t>(q * (r.warm.size() - 1) + 0.5));
      return r.warm[i] * 1000;
    };
    std::cout << fmt::format("{:<8} {:>10.1f} {:>12.1f} {:>10.1f}\n", r.name, r.cold * 1000,
                             pct(0.5), pct(0.95));
  }
  std::cout << fmt::format("worker start {:.2f} s; resident memory {} (peak {}); {} warm repeats\n",
                           start_s, status_field(pid, "VmRSS"), status_field(pid, "VmHWM"),
                           repeats);
  return 0;
}
