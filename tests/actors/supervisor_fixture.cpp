#include "tests/actors/supervisor_fixture.hpp"

#include "agents/agent_pool_spawn.hpp"
#include "agents/expert/expert_brains.hpp"
#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/eval.capnp.h"
#include "messages/content_hash.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <capnp/compat/json.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

namespace maxkernel::actors_test {

namespace {

const char* rmsnorm_reference = R"(import jax
import jax.numpy as jnp

def reference(x, weight, eps):
    x32 = x.astype(jnp.float32)
    ms = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    return (x32 * jax.lax.rsqrt(ms + eps) * weight.astype(jnp.float32)).astype(x.dtype)
)";

void set_type(schema::TensorType::Builder t, std::vector<int64_t> shape) {
  t.setDtype("bfloat16");
  auto s = t.initShape(static_cast<unsigned>(shape.size()));
  for (unsigned i = 0; i < shape.size(); ++i)
    s.set(i, shape[i]);
}

payload eval_result(schema::EvalRequest::Reader req, node_book& book) {
  std::string source = req.getCandidate().getSource().cStr();
  if (book.fail_first && book.sources.empty())
    book.failing.insert(source);
  book.sources.push_back(source);
  ++book.requests;
  book.scopes.insert(req.getOptions().getStoreScope().cStr());
  bool is_case = req.getOptions().getSeeds().size() > 0;
  if (is_case)
    book.case_sources.push_back(source);
  bool fails = book.failing.count(source) > 0;
  bool fails_case = is_case && book.failing_cases.count(source) > 0;
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::EvalResult>();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  r.setCandidateId(req.getCandidate().getId());
  r.setBackend("model");
  r.setKey(messages::sha256_hex(source));
  auto phases = r.initPhases(4);
  schema::Phase names[] = {schema::Phase::LOAD, schema::Phase::LOWER, schema::Phase::TEST,
                           schema::Phase::PROFILE};
  for (unsigned i = 0; i < 4; ++i) {
    phases[i].setPhase(names[i]);
    phases[i].setStatus(fails && i >= 2 ? schema::Status::SKIPPED : schema::Status::OK);
  }
  if (fails) {
    phases[1].setStatus(schema::Status::FAILED);
    phases[1].setErrorClass(book.failing_class);
    phases[1].setMessage(book.failing_class == schema::ErrorClass::VMEM_OOM
                           ? "the kernel's blocks need 40.0 MiB of VMEM, more than the 32.0 "
                             "MiB limit"
                           : "INTERNAL: Mosaic failed to compile the kernel");
    return messages::make_payload<schema::EvalResult>(msg);
  }
  if (fails_case) {
    phases[2].setStatus(schema::Status::FAILED);
    phases[2].setErrorClass(schema::ErrorClass::MISMATCH);
    phases[2].setMessage("configuration 0, seed 5: 3 of 524288 elements beyond tolerance");
  }
  r.setCorrect(!fails_case);
  auto tc = r.initTest().initCases(1)[0];
  tc.setKind("fresh");
  tc.setPassed(!fails_case);
  tc.setOutput(0);
  tc.setMaxAbsErr(fails_case ? 0.5 : 1e-3);
  tc.setMaxRelErr(fails_case ? 0.5 : 1e-3);
  tc.setInputShapes("(4,256,512) bfloat16, (512,) bfloat16");
  double t = modeled_time_us(source, book.best_block);
  auto p = r.initProfile();
  r.setHasProfile(true);
  p.setSchemaVersion(schema::SCHEMA_VERSION);
  p.setTiming(schema::Timing::MODELED);
  p.setChip(req.getOptions().getChip());
  p.setTimeUs(t);
  p.setRooflineUs(roofline_us);
  p.setBound("memory");
  p.setHbmBytes(2.0 * 4 * 256 * 512 * 2);
  p.setFlops(4.0 * 4 * 256 * 512);
  p.setDmaUs(t * 0.8);
  p.setExposedDmaUs(t * 0.5);
  p.setComputeUs(t * 0.1);
  p.setOverheadUs(t * 0.1);
  p.setBackend("model");
  if (book.structure) {
    r.setHasStructure(true);
    auto st = r.initStructure();
    st.setSchemaVersion(schema::SCHEMA_VERSION);
    st.initPallasCalls(1)[0].setName(kernel_params(source));
  }
  return messages::make_payload<schema::EvalResult>(msg);
}

payload decision_payload(unsigned seq, const scripted_decision& s) {
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::Decision>();
  d.setSchemaVersion(schema::SCHEMA_VERSION);
  d.setSeq(seq);
  d.setKind(s.kind);
  d.setText(s.text);
  auto ch = d.initChanges(static_cast<unsigned>(s.changes.size()));
  for (unsigned i = 0; i < s.changes.size(); ++i) {
    ch[i].setName(s.changes[i].first);
    ch[i].setValue(s.changes[i].second);
  }
  d.setSource(s.source);
  d.setSteps(s.steps);
  d.setOperator(s.who);
  return messages::make_payload<schema::Decision>(msg);
}

}  // namespace

namespace {

struct recorded_input {
  std::string name;
  std::vector<int64_t> shape;  // empty: the static scalar `value`
  std::string value{};
};

// A task over tests/agents/expert/data/<name>.json (written from the real reference).
std::shared_ptr<task> recorded_task(const std::string& name, const char* reference,
                                    const std::vector<recorded_input>& inputs,
                                    std::vector<int64_t> output) {
  auto t = std::make_shared<task>();
  std::ifstream in(std::string(MAXKERNEL_EXPERT_TEST_DATA) + "/" + name + ".json");
  std::stringstream text;
  text << in.rdbuf();
  capnp::JsonCodec codec;
  codec.decode(kj::StringPtr(text.str().c_str()), t->graph_msg.initRoot<schema::DataflowGraph>());
  auto spec = t->spec_msg.initRoot<schema::KernelSpec>();
  spec.setSchemaVersion(schema::SCHEMA_VERSION);
  spec.setName(name);
  spec.setFormat(schema::SpecFormat::NATIVE);
  spec.setReference(reference);
  spec.setReferenceEntry("reference");
  spec.setChip("v6e");
  auto tol = spec.initTolerances(1)[0];
  tol.setOutput(-1);
  tol.setAtol(2e-2);
  tol.setRtol(2e-2);
  auto cfg = spec.initConfigurations(1)[0];
  cfg.setName("default");
  auto in_list = cfg.initInputs(static_cast<unsigned>(inputs.size()));
  for (unsigned i = 0; i < inputs.size(); ++i) {
    in_list[i].setName(inputs[i].name);
    if (inputs[i].shape.empty()) {
      in_list[i].setIsStatic(true);
      in_list[i].setStaticValue(inputs[i].value);
    } else {
      set_type(in_list[i].initType(), inputs[i].shape);
      in_list[i].initGenerator().initNormal().setStd(1.0);
    }
  }
  set_type(cfg.initOutputs(1)[0], std::move(output));
  return t;
}

const char* matmul_reference = R"(import jax
import jax.numpy as jnp

def reference(x, w, b):
    y = jnp.einsum("mk,kn->mn", x, w, preferred_element_type=jnp.float32) + b.astype(jnp.float32)
    return jax.nn.softmax(jax.nn.gelu(y), axis=-1).astype(x.dtype)
)";

}  // namespace

std::shared_ptr<task> rmsnorm_task() {
  return recorded_task("rmsnorm_3d", rmsnorm_reference,
                       {{"x", {4, 256, 512}}, {"weight", {512}}, {"eps", {}, "1e-06"}},
                       {4, 256, 512});
}

std::shared_ptr<task> matmul_task() {
  return recorded_task("matmul_bias_gelu_softmax", matmul_reference,
                       {{"x", {512, 1024}}, {"w", {1024, 2048}}, {"b", {2048}}}, {512, 2048});
}

namespace {

// The header's params the stand-in's time depends on; nullopt without a header.
std::optional<nlohmann::json> timed_params(const std::string& source) {
  auto at = source.find("# params: ");
  if (at == std::string::npos)
    return std::nullopt;
  auto end = source.find('\n', at);
  auto params = nlohmann::json::parse(source.substr(at + 10, end - at - 10), nullptr, false);
  nlohmann::json out = nlohmann::json::object();
  if (params.is_object())
    for (const auto& [k, v] : params.items())
      if (v.is_number() && k != "vmem_limit_bytes" && v.get<double>() > 0)
        out[k] = v;
  return out;
}

}  // namespace

double modeled_time_us(const std::string& source, double best_block) {
  auto params = timed_params(source);
  if (!params)
    return 40.0 + static_cast<double>(source.size() % 23);
  double t = 10;
  for (const auto& [k, v] : params->items())
    t += 3 * std::abs(std::log2(v.get<double>()) - std::log2(best_block));
  return t;
}

std::string kernel_params(const std::string& source) {
  auto params = timed_params(source);
  return params ? params->dump() : source;
}

stand_in_node spawn_stand_in_node(caf::actor_system& sys, std::shared_ptr<node_book> book) {
  return sys.spawn([book](stand_in_node::pointer self) -> stand_in_node::behavior_type {
    auto eval = [self, book](const payload& p) -> caf::result<payload> {
      std::string error;
      auto req = messages::open_payload<schema::EvalRequest>(p, error);
      if (!req)
        return messages::make_error(messages::error_code::malformed_message, error);
      auto reply = eval_result(req->root<schema::EvalRequest>(), *book);
      if (auto e = book->errors.find(book->requests); e != book->errors.end())
        return messages::make_error(e->second, "stand-in node: request " +
                                                 std::to_string(book->requests));
      if (book->order == answer_order::at_once)
        return reply;
      auto rp = self->make_response_promise<payload>();
      book->held.emplace_back(rp, std::move(reply));
      return rp;
    };
    return {
      [eval](messages::evaluate_atom, const payload& p) -> caf::result<payload> {
        return eval(p);
      },
      [eval](messages::evaluate_atom, const payload& p, uint32_t) -> caf::result<payload> {
        return eval(p);
      },
      [](messages::load_atom, const std::string&) -> caf::result<payload> {
        return messages::make_error(messages::error_code::bad_input, "a stand-in loads nothing");
      },
      [](messages::load_atom, const payload&) -> caf::result<payload> {
        return messages::make_error(messages::error_code::bad_input, "a stand-in loads nothing");
      },
      [](messages::analyze_atom, const payload&) -> caf::result<payload> {
        return messages::make_error(messages::error_code::bad_input, "a stand-in analyzes nothing");
      },
      [](messages::info_atom) -> caf::result<payload> {
        return messages::make_error(messages::error_code::bad_input, "a stand-in has no info");
      },
      [book](release_atom) {
        auto held = std::move(book->held);
        book->held.clear();
        book->max_held = std::max(book->max_held, held.size());
        if (book->order == answer_order::reversed)
          std::reverse(held.begin(), held.end());
        for (auto& [rp, reply] : held)
          rp.deliver(std::move(reply));
      },
    };
  });
}

std::vector<std::string> operator_book::notices() {
  std::vector<std::string> out;
  for (auto& e : events)
    if (e.root<schema::OperatorEvent>().isNotice())
      out.push_back(e.root<schema::OperatorEvent>().getNotice().cStr());
  return out;
}

std::vector<unsigned> operator_book::noticed_proposals() {
  std::vector<unsigned> out;
  for (auto& e : events)
    if (e.root<schema::OperatorEvent>().isProposal())
      out.push_back(e.root<schema::OperatorEvent>().getProposal().getSeq());
  return out;
}

std::vector<std::string> operator_book::decided_by() {
  std::vector<std::string> out;
  for (auto& e : events)
    if (e.root<schema::OperatorEvent>().isDecided())
      out.push_back(e.root<schema::OperatorEvent>().getDecided().getOperator().cStr());
  return out;
}

messages::operator_actor spawn_scripted_operator(caf::actor_system& sys,
                                                 std::shared_ptr<operator_book> book) {
  return sys.spawn(
    [book](messages::operator_actor::pointer self) -> messages::operator_actor::behavior_type {
      return {
        [self, book](messages::propose_atom, const payload& p) -> caf::result<payload> {
          std::string error;
          auto m = messages::open_payload<schema::Proposal>(p, error);
          if (!m)
            return messages::make_error(messages::error_code::malformed_message, error);
          m->allow_rereading();
          unsigned seq = m->root<schema::Proposal>().getSeq();
          book->proposals.push_back(std::move(*m));
          if (book->script.empty() || book->script.front().hold) {
            if (!book->script.empty())
              book->script.pop_front();
            auto rp = self->make_response_promise<payload>();
            book->held.push_back(rp);
            return rp;
          }
          auto d = book->script.front();
          book->script.pop_front();
          return decision_payload(static_cast<unsigned>(static_cast<int>(seq) + d.seq_offset), d);
        },
        [book](messages::notify_atom, const payload& p) {
          std::string error;
          auto m = messages::open_payload<schema::OperatorEvent>(p, error);
          ASSERT_TRUE(m) << error;
          m->allow_rereading();
          book->events.push_back(std::move(*m));
        },
        [](messages::status_atom) -> uint32_t { return 1; },
      };
    });
}

messages::planner_actor spawn_planner_spy(
  caf::actor_system& sys, messages::planner_actor real,
  std::shared_ptr<std::vector<std::vector<std::string>>> guidance) {
  return sys.spawn(
    [real, guidance](messages::planner_actor::pointer self)
      -> messages::planner_actor::behavior_type {
      return {
        [self, real, guidance](messages::plan_atom a, const payload& p) {
          std::string error;
          auto m = messages::open_payload<schema::PlannerRequest>(p, error);
          std::vector<std::string> g;
          if (m)
            for (auto t : m->root<schema::PlannerRequest>().getGuidance())
              g.push_back(t.cStr());
          guidance->push_back(std::move(g));
          return self->delegate(real, a, p);
        },
      };
    });
}

void supervisor_fixture::SetUp() {
  agents::brain_chains chains;
  chains.planner = {agents::expert::make_expert_planner()};
  chains.implementer = {agents::expert::make_expert_implementer()};
  chains.debugger = {agents::expert::make_expert_debugger()};
  pool = agents::spawn_agent_pool(env.sys, chains);
  node_actor = spawn_stand_in_node(env.sys, node);
  operator_actor = spawn_scripted_operator(env.sys, op);
  for (auto a : {caf::actor_cast<caf::actor>(pool.planner),
                 caf::actor_cast<caf::actor>(pool.implementer),
                 caf::actor_cast<caf::actor>(pool.debugger),
                 caf::actor_cast<caf::actor>(pool.tester),
                 caf::actor_cast<caf::actor>(pool.profiler), caf::actor_cast<caf::actor>(node_actor),
                 caf::actor_cast<caf::actor>(operator_actor)})
    to_stop.push_back(a);
}

void supervisor_fixture::TearDown() {
  for (auto& a : to_stop)
    env.self->send_exit(a, caf::exit_reason::user_shutdown);
  env.run_messages();
}

std::shared_ptr<std::vector<std::vector<std::string>>> supervisor_fixture::spy_on_planner() {
  auto log = std::make_shared<std::vector<std::vector<std::string>>>();
  pool.planner = spawn_planner_spy(env.sys, pool.planner, log);
  to_stop.push_back(caf::actor_cast<caf::actor>(pool.planner));
  return log;
}

payload supervisor_fixture::optimize_request(const search_settings& s) {
  static auto rmsnorm = rmsnorm_task();
  static auto matmul = matmul_task();
  auto& t = s.task == "matmul" ? matmul : rmsnorm;
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::OptimizeRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.setSpec(t->spec());
  req.setAnalysis(t->analysis());
  req.setReferenceTimeUs(100);
  req.setGraphPath(s.graph_path);
  req.setResume(s.resume);
  auto st = req.initSettings();
  st.setMode(s.mode);
  st.setChip(s.chip);
  st.setSeed(s.seed);
  st.setBudgetEvals(s.budget);
  st.setMaxRepairs(s.max_repairs);
  st.setBeamWidth(s.beam);
  st.setBranching(s.branching);
  st.setDive(s.dive);
  st.setPolicy(s.policy);
  st.setOperatorTimeoutSeconds(s.operator_timeout_s);
  st.setOnTimeout(s.on_timeout);
  st.setTestEveryCandidate(s.test_every_candidate);
  st.setStoreScope(s.store_scope);
  return messages::make_payload<schema::OptimizeRequest>(msg);
}

void supervisor_fixture::start(const messages::supervisor_actor& sup, const search_settings& s) {
  to_stop.push_back(caf::actor_cast<caf::actor>(sup));
  env.self->send(sup, messages::optimize_atom::value, optimize_request(s));
}

void supervisor_fixture::drive() {
  for (;;) {
    env.run_messages();
    if (node->held.empty())
      return;
    env.self->send(node_actor, release_atom::value);
  }
}

outcome supervisor_fixture::answer() {
  outcome o;
  o.answered = env.receive_now(
    [&](payload& p) {
      std::string error;
      o.result = messages::open_payload<schema::OptimizeResult>(p, error);
      EXPECT_TRUE(o.result) << error;
      if (o.result)
        o.result->allow_rereading();
    },
    [&](caf::error& e) { o.error = std::move(e); });
  return o;
}

double best_time_before(schema::OptimizeResult::Reader r, unsigned k) {
  double best = 0;
  for (unsigned i = 0; i < k && i < r.getVertices().size(); ++i) {
    auto v = r.getVertices()[i];
    bool accepted = v.getDecision().size() == 0 || v.getDecision() == "approved";
    if (v.getState() == schema::VertexState::EVALUATED && v.getCorrect() && accepted &&
        v.getTimeUs() > 0 && (best == 0 || v.getTimeUs() < best))
      best = v.getTimeUs();
  }
  return best;
}

unsigned expect_cases_only_when_faster(schema::OptimizeResult::Reader r,
                                       const std::vector<double>& bars, const node_book& book) {
  unsigned skipped = 0;
  std::set<std::string> cased(book.case_sources.begin(), book.case_sources.end());
  EXPECT_EQ(bars.size(), r.getVertices().size());
  for (unsigned k = 0; k < r.getVertices().size() && k < bars.size(); ++k) {
    auto v = r.getVertices()[k];
    SCOPED_TRACE(::testing::Message() << "vertex " << k << " at " << v.getTimeUs()
                                      << " us, bar " << bars[k] << " us");
    std::string source = v.getCandidate().getSource().cStr();
    std::string verdict = v.getVerdict().cStr();
    if (v.getState() != schema::VertexState::EVALUATED || !v.getCorrect()) {
      EXPECT_FALSE(v.getCasesSkipped());
      continue;
    }
    bool faster = bars[k] == 0 || v.getTimeUs() < bars[k];
    EXPECT_EQ(v.getCasesSkipped(), !faster) << verdict;
    if (faster) {
      EXPECT_GT(v.getEvaluations(), 1u);
      EXPECT_TRUE(cased.count(source)) << "a faster candidate's cases were not run";
      EXPECT_EQ(verdict.find("skipped"), std::string::npos) << verdict;
      continue;
    }
    ++skipped;
    EXPECT_EQ(v.getEvaluations(), 1u + v.getRepairs());
    EXPECT_FALSE(cased.count(source)) << "a slower candidate was sent as a tester's case";
    EXPECT_NE(verdict.find("the tester's cases skipped"), std::string::npos) << verdict;
    EXPECT_NE(verdict.find("is not faster than the best"), std::string::npos) << verdict;
    EXPECT_TRUE(v.getHasDiagnosis());  // still profiled: a parent for the next moves
  }
  if (r.getBest() >= 0) {
    EXPECT_FALSE(r.getVertices()[static_cast<unsigned>(r.getBest())].getCasesSkipped())
      << "the best is a candidate the tester's cases never saw";
  }
  return skipped;
}

std::vector<std::string> vertex_bytes(schema::OptimizeResult::Reader r) {
  std::vector<std::string> out;
  for (auto v : r.getVertices())
    out.push_back(messages::encode_root(v));
  return out;
}

std::vector<messages::decoded_message> transcript(schema::OptimizeResult::Reader r) {
  std::vector<messages::decoded_message> out;
  for (auto bytes : r.getTranscript()) {
    std::string error;
    auto e = messages::decode<schema::TranscriptEntry>(
      std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()), error);
    EXPECT_TRUE(e) << error;
    if (e) {
      e->allow_rereading();
      out.push_back(std::move(*e));
    }
  }
  return out;
}

}  // namespace maxkernel::actors_test
