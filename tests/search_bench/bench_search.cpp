// Benchmark (not a test, not registered with ctest): the speed of the graph search machinery
// itself, with every evaluation answered at once from the evaluation store. Issue 6 asks for
// at least 5,000 evaluations per second on this machine. scripts/bench-search runs it;
// docs/performance.md ("Search machinery") records the figures.
//
// Real: the graph supervisor (actors/graph_supervisor: its lineages, selection policy, stop
// rules, progress reports and search_record writing the SQLite graph file as `maxkernel
// optimize` does), the dispatcher (cluster/) in front of N tpu_nodes (tpu_nodes/, set up as
// cli/node_session sets them up for optimize), the evaluation store (search/, an SQLite file
// in WAL mode) they answer from, the worker pool with one JAX worker (its version is part of
// every key; it also makes the real evaluations below), the tester (agents/: its TestPlan for
// the spec, and a verdict on every candidate's cases), the profiler (agents/: a Diagnosis of
// every correct candidate's profile) and the expert debugger (never asked: every candidate is
// correct). The spec is a real one (scripts/bench-search: examples/matmul, with the kernel the
// expert matmul template renders for it) with its analysis by the worker.
//
// Stand-ins (tests/search_bench/bench_roles.hpp): the planner and the implementer. The expert
// planner runs out of moves after a few dozen candidates, and an LLM is slow and out of
// reach; these hand out variant n of the base kernel (its source plus one line), thousands of
// distinct candidates, at almost no cost, reading only the fields they need. A progress
// listener that counts stands in for optimize's progress line.
//
// The store is filled before the search: the base kernel is evaluated for real once per
// request a lineage makes (the default evaluation and each of the tester's cases); its
// stored results are then recorded under the keys of every variant's requests (computed by
// tpu_nodes::request_key, as the node computes them: checked on the base kernel's real
// keys), the default result's modeled time scaled by a fixed pseudo-random factor per
// variant so that the beam has something to choose, and its structure marked with the
// variant's number (each stands for a kernel of its own). A key the fill missed would reach the
// worker: the run counts store misses and fails when there is one.
//
// Each search runs with the graph file on disk (a fresh SQLite file, WAL, synchronous FULL,
// as search/search_graph opens it), in an in-memory SQLite database (":memory:") and without
// one (no graphPath): the cost of persistence, side by side in one run.
//
//   bench_search SPEC.yaml KERNEL.py [--candidates=N] [--beam=B] [--branching=K]
//                [--nodes=N] [--graph=disk,memory,none] [--repeat=R] [--lazy-cases]
//                [CAF options]
//
// By default every candidate gets the tester's cases (optimize --test-every-candidate: 1 +
// cases evaluations per candidate, all from the store); --lazy-cases runs optimize's default,
// where a candidate slower than the best gets the node's evaluation alone.
#include "actors/graph_supervisor.hpp"
#include "agents/brain_chains.hpp"
#include "agents/debugger_actor.hpp"
#include "agents/profiler_actor.hpp"
#include "agents/tester_actor.hpp"
#include "cluster/dispatcher.hpp"
#include "config/brain_config.hpp"
#include "config/native_spec_loader.hpp"
#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/cluster.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "maxkernel/schema/node_info.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/error.hpp"
#include "messages/eval_failure.hpp"
#include "messages/eval_request.hpp"
#include "messages/payload_codec.hpp"
#include "messages/type_registry.hpp"
#include "search/evaluation_store.hpp"
#include "search/state_dir.hpp"
#include "tests/search_bench/bench_roles.hpp"
#include "tpu_nodes/evaluator_revision.hpp"
#include "tpu_nodes/request_key.hpp"
#include "tpu_nodes/store_policy.hpp"
#include "tpu_nodes/tpu_node.hpp"
#include "tpu_nodes/worker_pool.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <fmt/format.h>

#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace maxkernel;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

struct options {
  std::string spec_path, kernel_path;
  unsigned candidates = 1000;
  unsigned beam = 4, branching = 8;
  unsigned nodes = 8;
  std::vector<std::string> graphs{"disk", "memory", "none"};
  unsigned repeat = 1;
  uint64_t seed = 7;
  std::string chip = "v6e";
  // The tester's cases for every candidate (optimize --test-every-candidate), so that each
  // candidate makes 1 + cases evaluations, as before b285840; --lazy-cases: optimize's
  // default (the cases only for a candidate faster than the best, so ~1 per candidate).
  bool lazy_cases = false;
  bool dive = true;  // --no-dive: breadth every round (optimize --no-dive)
};

struct fail : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts)
    out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');)
    if (!part.empty())
      out.push_back(part);
  return out;
}

// Ours first; whatever is left (--scheduler.*, ...) is for CAF.
options parse(int argc, char** argv, std::vector<char*>& caf_args) {
  options o;
  std::vector<std::string> positional;
  caf_args.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> std::optional<std::string> {
      std::string prefix = std::string("--") + name + "=";
      if (a.rfind(prefix, 0) == 0)
        return a.substr(prefix.size());
      return std::nullopt;
    };
    auto number = [&](const std::string& v) {
      char* end = nullptr;
      auto n = std::strtoul(v.c_str(), &end, 10);
      if (v.empty() || *end || n == 0)
        throw fail("bench_search: " + a + ": a whole number > 0");
      return static_cast<unsigned>(n);
    };
    if (auto v = value("candidates"))
      o.candidates = number(*v);
    else if (auto v = value("beam"))
      o.beam = number(*v);
    else if (auto v = value("branching"))
      o.branching = number(*v);
    else if (auto v = value("nodes"))
      o.nodes = number(*v);
    else if (auto v = value("repeat"))
      o.repeat = number(*v);
    else if (a == "--lazy-cases")
      o.lazy_cases = true;
    else if (a == "--no-dive")
      o.dive = false;
    else if (auto v = value("graph")) {
      o.graphs = split(*v);
      for (const auto& g : o.graphs)
        if (g != "disk" && g != "memory" && g != "none")
          throw fail("bench_search: --graph: disk, memory or none, not '" + g + "'");
    } else if (a.rfind("--", 0) == 0)
      caf_args.push_back(argv[i]);
    else
      positional.push_back(a);
  }
  if (positional.size() != 2)
    throw fail("usage: bench_search SPEC.yaml KERNEL.py [--candidates=N] [--beam=B] "
               "[--branching=K] [--nodes=N] [--graph=disk,memory,none] [--repeat=R] "
               "[--lazy-cases] [--no-dive] [CAF options]");
  o.spec_path = positional[0];
  o.kernel_path = positional[1];
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw fail("bench_search: cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The EvalRequest a lineage sends (actors/lineage.hpp, eval_request): the default options of
// build_eval_request, or a tester case's options with the search's chip.
messages::payload lineage_request(schema::KernelSpec::Reader spec, const std::string& source,
                                  const std::string& chip,
                                  std::optional<schema::EvalOptions::Reader> options) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::EvalRequest>();
  messages::request_settings settings;
  settings.chip = chip;
  messages::build_eval_request(req, spec, source, "bench_search", settings);
  if (options) {
    req.setOptions(*options);
    req.getOptions().setChip(chip);
  }
  return messages::make_payload<schema::EvalRequest>(msg);
}

std::string key_of(const messages::payload& request, const std::string& chip,
                   const std::string& jax_version) {
  std::string error;
  auto msg = messages::open_payload<schema::EvalRequest>(request, error);
  if (!msg)
    throw fail("bench_search: EvalRequest: " + error);
  return tpu_nodes::request_key(msg->root<schema::EvalRequest>(), chip, "model", jax_version,
                                tpu_nodes::evaluator_revision("model", chip));
}

// A fixed factor in [0.6, 1.4) for variant n: the modeled times the beam chooses among.
double time_factor(uint64_t n) {
  uint64_t x = n + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return 0.6 + 0.8 * static_cast<double>(x >> 11) / static_cast<double>(1ull << 53);
}

template <class Handle, class... Args>
messages::payload ask(caf::scoped_actor& self, const Handle& to, const char* what,
                      Args&&... args) {
  std::optional<messages::payload> out;
  std::string error;
  self->request(to, 10min, std::forward<Args>(args)...)
    .receive([&](messages::payload& p) { out = std::move(p); },
             [&](caf::error& e) { error = messages::message_of(e); });
  if (!out)
    throw fail(fmt::format("bench_search: {}: {}", what, error));
  return std::move(*out);
}

template <class T>
messages::decoded_message open(const messages::payload& p, const char* what) {
  std::string error;
  auto msg = messages::open_payload<T>(p, error);
  if (!msg)
    throw fail(fmt::format("bench_search: {}: {}", what, error));
  msg->allow_rereading();
  return std::move(*msg);
}

struct run_figures {
  double seconds = 0, cpu = 0;
  uint64_t evaluations = 0, candidates = 0, cache_hits = 0, rounds = 0, progress = 0;
  uint64_t store_misses = 0, redispatched = 0, requeued = 0;
  std::string stop_reason;
  int best = -1;
  uintmax_t graph_bytes = 0;
};

}  // namespace

int main(int argc, char** argv) try {
  std::vector<char*> caf_args;
  auto o = parse(argc, argv, caf_args);
  caf::actor_system_config cfg;
  messages::register_types(cfg);
  if (auto err = cfg.parse(static_cast<int>(caf_args.size()), caf_args.data()))
    throw fail("bench_search: " + cfg.render(err));

  // A private state directory: the store and the graph files, removed at the end.
  std::string tmpl = (fs::temp_directory_path() / "bench_search.XXXXXX").string();
  if (!mkdtemp(tmpl.data()))
    throw fail("bench_search: cannot make a temporary directory");
  fs::path dir = tmpl;
  struct remove_dir {
    fs::path p;
    ~remove_dir() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};

  capnp::MallocMessageBuilder spec_msg;
  config::spec_error spec_err;
  if (!config::load_native_spec(o.spec_path, {}, spec_msg.initRoot<schema::KernelSpec>(),
                                spec_err))
    throw fail("bench_search: " + spec_err.what());
  auto spec = spec_msg.getRoot<schema::KernelSpec>().asReader();
  std::string base = read_file(o.kernel_path);

  std::string error;
  std::string store_path = search::default_store_path(dir.string());
  auto store = search::evaluation_store::open(store_path, error);
  if (!store)
    throw fail("bench_search: " + error);

  caf::actor_system sys{cfg};
  // As cli/node_session sets them up for optimize: one worker pool, N nodes sharing it and
  // the store, a dispatcher in front.
  tpu_nodes::pool_config pc;
  pc.workers = 1;
  auto pool = tpu_nodes::spawn_worker_pool(sys, pc);
  std::vector<messages::tpu_node_actor> nodes;
  for (unsigned i = 0; i < o.nodes; ++i) {
    tpu_nodes::node_config nc;
    nc.node_id = fmt::format("bench:{}", i);
    nc.device = i;
    nc.chip = o.chip;
    nc.queue_capacity = 4;
    nc.store = store.get();
    nodes.push_back(tpu_nodes::spawn_tpu_node(sys, nc, pool));
  }
  cluster::dispatcher_config dc;
  dc.straggler_min = std::chrono::minutes(2);
  dc.straggler_factor = 3.0;
  auto dispatcher = cluster::spawn_dispatcher(sys, nodes, dc);
  messages::tpu_node_actor front = dispatcher;
  auto tester = agents::spawn_tester(sys);
  auto profiler = agents::spawn_profiler(sys);
  auto debugger = agents::spawn_debugger(
    sys, agents::make_brain_chains(config::default_brain_config()).debugger);

  int status = 0;
  {
    caf::scoped_actor self{sys};
    auto stop_all = [&] {
      self->send_exit(dispatcher, caf::exit_reason::user_shutdown);
      for (auto& n : nodes)
        self->send_exit(n, caf::exit_reason::user_shutdown);
      self->send_exit(pool, caf::exit_reason::user_shutdown);
      self->send_exit(tester, caf::exit_reason::user_shutdown);
      self->send_exit(profiler, caf::exit_reason::user_shutdown);
      self->send_exit(debugger, caf::exit_reason::user_shutdown);
    };
    try {
      // The worker's JAX version (part of every key), as node_session waits for it.
      std::string jax_version;
      auto give_up = clock_type::now() + 3min;
      while (jax_version.empty()) {
        if (clock_type::now() > give_up)
          throw fail("bench_search: the JAX worker did not start within 3 minutes");
        auto info = open<schema::NodeInfo>(ask(self, nodes[0], "info", messages::info_atom::value),
                                           "NodeInfo");
        jax_version = info.root<schema::NodeInfo>().getJaxVersion().cStr();
        if (jax_version.empty())
          std::this_thread::sleep_for(50ms);
      }

      // The reference's analysis, and the tester's plan as the supervisor will get it.
      capnp::MallocMessageBuilder an_msg;
      auto an = an_msg.initRoot<schema::AnalyzeRequest>();
      an.setSpec(spec);
      an.setConfiguration(0);
      auto analysis =
        open<schema::DataflowGraph>(ask(self, front, "analyze", messages::analyze_atom::value,
                                        messages::make_payload<schema::AnalyzeRequest>(an_msg)),
                                    "DataflowGraph");
      capnp::MallocMessageBuilder tr_msg;
      auto tr = tr_msg.initRoot<schema::TesterRequest>();
      tr.setSchemaVersion(schema::SCHEMA_VERSION);
      tr.setSpec(spec);
      tr.setAnalysis(analysis.root<schema::DataflowGraph>());
      tr.setChip(o.chip);
      tr.setSeed(o.seed);
      auto plan = open<schema::TestPlan>(
        ask(self, tester, "test plan", messages::testplan_atom::value,
            messages::make_payload<schema::TesterRequest>(tr_msg)),
        "TestPlan");
      auto cases = plan.root<schema::TestPlan>().getCases();
      unsigned per_candidate = 1 + cases.size();

      // The base kernel, evaluated for real once per request of a lineage.
      auto requests_of = [&](const std::string& source) {
        std::vector<messages::payload> out;
        out.push_back(lineage_request(spec, source, o.chip, std::nullopt));
        for (auto c : cases)
          out.push_back(lineage_request(spec, source, o.chip, c.getOptions()));
        return out;
      };
      auto t0 = clock_type::now();
      std::vector<std::string> base_results;
      double base_time_us = 0;
      auto base_requests = requests_of(base);
      for (size_t k = 0; k < base_requests.size(); ++k) {
        auto& req = base_requests[k];
        auto r = open<schema::EvalResult>(
          ask(self, front, "real evaluation of the base kernel", messages::evaluate_atom::value,
              req, uint32_t{600'000}),
          "EvalResult");
        // The default evaluation must pass; the cases are judged by the tester below (a case
        // the worker skips, as the reference disallows its inputs, does not fail).
        if (k == 0 && !r.root<schema::EvalResult>().getCorrect())
          throw fail(fmt::format("bench_search: the base kernel is not correct on {}: {}",
                                 o.spec_path,
                                 messages::failure_message(r.root<schema::EvalResult>())));
        // Our key must be the node's: the node recorded the result under it.
        auto stored = store->find(key_of(req, o.chip, jax_version));
        if (!stored)
          throw fail("bench_search: the key computed here is not the node's");
        if (base_results.empty())
          base_time_us = r.root<schema::EvalResult>().getProfile().getTimeUs();
        base_results.push_back(std::move(*stored));
      }
      double real_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      {
        capnp::MallocMessageBuilder jr_msg;
        auto jr = jr_msg.initRoot<schema::JudgeRequest>();
        jr.setSchemaVersion(schema::SCHEMA_VERSION);
        jr.setSpec(spec);
        jr.setPlan(plan.root<schema::TestPlan>());
        auto results = jr.initResults(cases.size());
        std::vector<messages::decoded_message> decoded;
        for (size_t k = 1; k < base_results.size(); ++k) {
          decoded.push_back(open<schema::EvalResult>(
            messages::payload{capnp::typeId<schema::EvalResult>(), base_results[k]}, "stored"));
          results.setWithCaveats(static_cast<unsigned>(k - 1),
                                 decoded.back().root<schema::EvalResult>());
        }
        auto verdict = open<schema::Verdict>(
          ask(self, tester, "judge", messages::judge_atom::value,
              messages::make_payload<schema::JudgeRequest>(jr_msg)),
          "Verdict");
        if (!verdict.root<schema::Verdict>().getCorrect())
          throw fail(fmt::format("bench_search: the tester fails the base kernel: {}",
                                 verdict.root<schema::Verdict>().getSummary().cStr()));
      }

      // Every variant's requests, answered by the base kernel's results. The planner hands
      // out more than the search takes: a round keeps half of what the budget leaves, a
      // dive one of the steps it asked for.
      uint64_t variants = 2 * (o.candidates + uint64_t{o.beam} * o.branching);
      t0 = clock_type::now();
      std::string spec_name = spec.getName().cStr();
      for (uint64_t n = 0; n < variants; ++n) {
        auto reqs = requests_of(search_bench::variant_source(base, n));
        for (size_t k = 0; k < reqs.size(); ++k) {
          auto key = key_of(reqs[k], o.chip, jax_version);
          auto r = open<schema::EvalResult>(
            messages::payload{capnp::typeId<schema::EvalResult>(), base_results[k]}, "stored");
          capnp::MallocMessageBuilder b;
          b.setRoot(r.root<schema::EvalResult>());
          auto out = b.getRoot<schema::EvalResult>();
          out.setKey(key);
          if (k == 0 && out.getHasProfile())
            out.getProfile().setTimeUs(out.getProfile().getTimeUs() * time_factor(n));
          // Each variant stands for a kernel of its own (its own time), so its structure is
          // its own too: with the base's everywhere, graph's one-vertex-per-kernel rule would
          // close every vertex but the fastest and the search would end early, exhausted.
          if (k == 0 && out.getHasStructure() && out.getStructure().getPallasCalls().size() > 0) {
            auto call = out.getStructure().getPallasCalls()[0];
            call.setName(fmt::format("{} (variant {})", call.getName().cStr(), n));
          }
          auto bytes = messages::encode(b);
          if (!store->record(tpu_nodes::record_for(key, bytes, out.asReader(), spec_name, o.chip),
                             error))
            throw fail("bench_search: store: " + error);
        }
      }
      double fill_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      fmt::print("bench_search: {} on {}, JAX {}; {} node(s) behind the dispatcher; tester "
                 "plan {} case(s), so {} evaluations per candidate; base kernel {:.2f} us "
                 "(modeled), {} real evaluations in {:.1f} s; store filled with {} variants "
                 "({} results) in {:.1f} s\n",
                 spec_name, o.chip, jax_version, o.nodes, cases.size(), per_candidate,
                 base_time_us, per_candidate, real_s, variants, variants * per_candidate,
                 fill_s);
      std::fflush(stdout);

      auto run = [&](const std::string& graph, unsigned index) {
        run_figures f;
        auto progress = std::make_shared<std::atomic<uint64_t>>(0);
        messages::agent_pool roles{search_bench::spawn_bench_planner(sys, variants),
                                   search_bench::spawn_bench_implementer(sys, base), debugger,
                                   tester, profiler};
        auto listener = search_bench::spawn_progress_counter(sys, progress);
        auto supervisor = actors::spawn_graph_supervisor(sys, roles, front, listener);
        capnp::MallocMessageBuilder req_msg;
        auto req = req_msg.initRoot<schema::OptimizeRequest>();
        req.setSchemaVersion(schema::SCHEMA_VERSION);
        req.setSpec(spec);
        req.setAnalysis(analysis.root<schema::DataflowGraph>());
        auto s = req.initSettings();
        s.setMode("graph");
        s.setChip(o.chip);
        s.setSeed(o.seed);
        s.setBudgetEvals(o.candidates);
        s.setMaxRepairs(2);
        s.setBeamWidth(o.beam);
        s.setBranching(o.branching);
        s.setPolicy("beam");
        s.setDive(o.dive);
        s.setTestEveryCandidate(!o.lazy_cases);
        req.setReferenceTimeUs(base_time_us);
        std::string graph_path = graph == "disk"     ? (dir / fmt::format("graph-{}.sqlite", index)).string()
                                 : graph == "memory" ? ":memory:"
                                                     : "";
        req.setGraphPath(graph_path);
        auto payload = messages::make_payload<schema::OptimizeRequest>(req_msg);
        uint64_t misses = store->misses();
        double cpu0 = cpu_seconds();
        auto start = clock_type::now();
        auto reply = ask(self, supervisor, "optimize", messages::optimize_atom::value, payload);
        f.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        f.cpu = cpu_seconds() - cpu0;
        f.store_misses = store->misses() - misses;
        auto result = open<schema::OptimizeResult>(reply, "OptimizeResult");
        auto r = result.root<schema::OptimizeResult>();
        f.evaluations = r.getEvaluations();
        f.candidates = r.getCandidatesEvaluated();
        f.cache_hits = r.getCacheHits();
        f.rounds = r.getRounds();
        f.stop_reason = r.getStopReason().cStr();
        f.best = r.getBest();
        auto st = open<schema::DispatcherStatus>(
          ask(self, dispatcher, "status", messages::status_atom::value), "DispatcherStatus");
        f.redispatched = st.root<schema::DispatcherStatus>().getRedispatched();
        f.requeued = st.root<schema::DispatcherStatus>().getRequeued();
        self->send_exit(supervisor, caf::exit_reason::user_shutdown);
        self->send_exit(listener, caf::exit_reason::user_shutdown);
        self->send_exit(roles.planner, caf::exit_reason::user_shutdown);
        self->send_exit(roles.implementer, caf::exit_reason::user_shutdown);
        f.progress = progress->load();
        std::error_code ec;
        if (graph == "disk") {
          f.graph_bytes = fs::file_size(graph_path, ec);
          auto wal = fs::file_size(graph_path + "-wal", ec);
          if (!ec)
            f.graph_bytes += wal;
        }
        return f;
      };

      uint64_t redispatched = 0, requeued = 0;
      for (unsigned rep = 0; rep < o.repeat; ++rep) {
        for (size_t g = 0; g < o.graphs.size(); ++g) {
          const auto& graph = o.graphs[g];
          auto f = run(graph, rep * static_cast<unsigned>(o.graphs.size()) + static_cast<unsigned>(g));
          std::vector<std::string> wrong;
          if (f.stop_reason != "budget")
            wrong.push_back("stopped by '" + f.stop_reason + "', not the budget");
          if (f.candidates != o.candidates)
            wrong.push_back(fmt::format("{} candidates, not {}", f.candidates, o.candidates));
          if (o.lazy_cases ? f.evaluations < f.candidates ||
                               f.evaluations > f.candidates * per_candidate
                           : f.evaluations != f.candidates * per_candidate)
            wrong.push_back(fmt::format("{} evaluations, not {} per candidate", f.evaluations,
                                        o.lazy_cases ? fmt::format("1 to {}", per_candidate)
                                                     : std::to_string(per_candidate)));
          if (f.cache_hits != f.evaluations || f.store_misses != 0)
            wrong.push_back(fmt::format("{} evaluations were not store hits ({} store misses)",
                                        f.evaluations - f.cache_hits, f.store_misses));
          if (f.best < 0)
            wrong.push_back("no best vertex");
          fmt::print("bench_search: graph {:<6} {:>7.0f} evaluations/s, {:>6.0f} candidates/s "
                     "({} evaluations, {} candidates, {} rounds of beam {} x branching {}, in "
                     "{:.2f} s; CPU {:.2f} s = {:.0f} us per evaluation; {} progress reports; "
                     "graph file {}){}\n",
                     graph, f.evaluations / f.seconds, f.candidates / f.seconds, f.evaluations,
                     f.candidates, f.rounds, o.beam, o.branching, f.seconds, f.cpu,
                     1e6 * f.cpu / std::max<uint64_t>(1, f.evaluations), f.progress,
                     graph == "disk" ? fmt::format("{:.1f} MB", f.graph_bytes / 1e6)
                     : graph == "memory" ? std::string("in memory")
                                         : std::string("none"),
                     wrong.empty() ? "" : "; WRONG: " + join(wrong));
          std::fflush(stdout);
          if (!wrong.empty())
            status = 1;
          redispatched = f.redispatched;
          requeued = f.requeued;
        }
      }
      fmt::print("bench_search: dispatcher: {} straggler copies, {} requeued; store hits {}, "
                 "misses {} (the base kernel's real evaluations)\n",
                 redispatched, requeued, store->hits(), store->misses());
    } catch (...) {
      stop_all();
      throw;
    }
    stop_all();
  }
  return status;
} catch (const fail& e) {
  std::cerr << e.what() << "\n";
  return 3;
}
