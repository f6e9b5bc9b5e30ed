// The recurrence, backward and selection templates (retention, chunked_recurrence,
// matmul_backward, shared_operand_matmul, attention_backward, topk) on analyze summaries of
// small references (recurrence_data/, written by make_graphs.py): each is matched by its
// template (and not by the others), renders the same source twice, fits the chip's VMEM,
// and the strategy playbook offers at least three distinct children that render too.
#include "agents/expert/index_evaluator.hpp"
#include "agents/expert/operand_trace.hpp"
#include "agents/expert/playbook.hpp"
#include "agents/expert/template_registry.hpp"
#include "config/chip_loader.hpp"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <set>
#include <sstream>

using namespace maxkernel;
namespace ex = agents::expert;

namespace {

struct loaded {
  std::unique_ptr<capnp::MallocMessageBuilder> graph_msg, spec_msg;
  std::unique_ptr<ex::graph_view> view;
  schema::KernelSpec::Reader spec;
};

loaded load(const std::string& name, const std::vector<std::string>& inputs) {
  std::ifstream in(std::string(MAXKERNEL_RECURRENCE_TEST_DATA) + "/" + name + ".json");
  std::stringstream text;
  text << in.rdbuf();
  loaded l;
  l.graph_msg = std::make_unique<capnp::MallocMessageBuilder>();
  auto root = l.graph_msg->initRoot<schema::DataflowGraph>();
  capnp::JsonCodec codec;
  codec.decode(kj::StringPtr(text.str().c_str()), root);
  l.view = std::make_unique<ex::graph_view>(root.asReader());
  l.spec_msg = std::make_unique<capnp::MallocMessageBuilder>();
  auto spec = l.spec_msg->initRoot<schema::KernelSpec>();
  spec.setName(name);
  auto cfg = spec.initConfigurations(1)[0];
  auto list = cfg.initInputs(static_cast<unsigned>(inputs.size()));
  for (unsigned i = 0; i < inputs.size(); ++i)
    list[i].setName(inputs[i]);
  l.spec = spec.asReader();
  return l;
}

config::chip chip(const char* name) {
  config::chip c;
  config::spec_error e;
  EXPECT_TRUE(config::load_chip(name, c, e)) << e.what();
  return c;
}

const std::set<std::string> kMine = {"retention", "chunked_recurrence", "matmul_backward",
                                     "shared_operand_matmul", "attention_backward", "topk"};

// Matches `family` (and none of the other templates of this file), renders, fits, and
// gives three distinct rendered children.
void check_family(const loaded& l, const std::string& family, const char* chip_name) {
  auto found = ex::match_templates(*l.view, l.spec);
  const ex::matched_template* mine = nullptr;
  for (const auto& m : found) {
    if (m.tmpl->name() == family)
      mine = &m;
    else
      EXPECT_FALSE(kMine.count(m.tmpl->name())) << family << " also matched by " << m.tmpl->name();
  }
  ASSERT_NE(mine, nullptr) << family << " does not match";
  auto c = chip(chip_name);
  auto params = mine->tmpl->initial_params(mine->match, c);
  EXPECT_LE(mine->tmpl->vmem_bytes(mine->match, params), ex::vmem_limit(params, c)) << params.dump();
  std::string a, b, error;
  ASSERT_TRUE(mine->tmpl->render(mine->match, params, a, error)) << error;
  ASSERT_TRUE(mine->tmpl->render(mine->match, params, b, error)) << error;
  EXPECT_EQ(a, b);  // deterministic
  EXPECT_EQ(a.rfind("# maxkernel expert template: " + family, 0), 0u);
  EXPECT_NE(a.find("def workload("), std::string::npos);
  EXPECT_NE(a.find("pl.pallas_call("), std::string::npos);
  EXPECT_EQ(a.find("interpret"), std::string::npos);  // interpret mode is switched from outside
  auto moves = ex::playbook_moves(*mine->tmpl, mine->match, params, c, nullptr, {});
  std::set<std::string> keys;
  for (const auto& mv : moves) {
    keys.insert(ex::params_key(family, mv.params));
    std::string child;
    EXPECT_TRUE(mine->tmpl->render(mine->match, mv.params, child, error))
        << mv.name << " " << mv.params.dump() << ": " << error;
    EXPECT_NE(child, a) << mv.name;
  }
  EXPECT_GE(keys.size(), 3u) << family << ": " << moves.size() << " moves";
}

}  // namespace

TEST(RecurrenceTemplates, RetentionWithDecayRowSumsAndNormaliser) {
  auto l = load("retention", {"q", "k", "v"});
  check_family(l, "retention", "v6e");
  auto found = ex::match_templates(*l.view, l.spec);
  for (const auto& m : found)
    if (m.tmpl->name() == "retention") {
      EXPECT_EQ(m.match.facts["row_scale"], "\"div\"");
      EXPECT_TRUE(m.match.facts["causal"].get<bool>());
      // log-gamma per head, two position vectors and the decay's row sums
      EXPECT_EQ(m.match.facts["seed_present"].size(), 4u);
    }
}

TEST(RecurrenceTemplates, SsdRolesFromTheComputation) {
  auto l = load("ssd", {"x", "dt", "A", "B", "C", "D"});
  check_family(l, "chunked_recurrence", "v5e");
  for (const auto& m : ex::match_templates(*l.view, l.spec))
    if (m.tmpl->name() == "chunked_recurrence") {
      EXPECT_EQ(m.match.facts["B"], 3);
      EXPECT_EQ(m.match.facts["C"], 4);
      EXPECT_EQ(m.match.facts["D"], 5);
      EXPECT_EQ(m.match.facts["state"], 128);
      // x is [b, t, h, p]: read in place, which needs no [L, P] block per head (64 of 128
      // lanes each), or head-major copies
      auto params = m.tmpl->initial_params(m.match, chip("v5e"));
      EXPECT_EQ(params["x_layout"], "in_place");
      EXPECT_EQ(params["mxu_dtype"], "split_bf16");
      auto copies = params;
      copies["x_layout"] = "transposed";
      EXPECT_EQ(m.match.facts["head_dim"], 64);
      EXPECT_LT(m.tmpl->vmem_bytes(m.match, params), m.tmpl->vmem_bytes(m.match, copies));
      std::set<std::string> names;
      for (const auto& t : m.tmpl->tunables(m.match))
        names.insert(t.name);
      EXPECT_TRUE(names.count("x_layout") && names.count("mxu_dtype"));
      std::string src, error;
      copies["x_layout"] = "diagonal";
      EXPECT_FALSE(m.tmpl->render(m.match, copies, src, error));
      EXPECT_NE(error.find("x_layout"), std::string::npos) << error;
    }
}

TEST(RecurrenceTemplates, MatmulBackwardFromVjp) {
  auto l = load("matmul_vjp", {"x", "w", "d_y"});
  check_family(l, "matmul_backward", "v6e");
  for (const auto& m : ex::match_templates(*l.view, l.spec))
    if (m.tmpl->name() == "matmul_backward") {
      const auto& p = m.match.facts["products"];
      ASSERT_EQ(p.size(), 2u);
      EXPECT_EQ(p[0]["a"], 2);  // dX = dY @ W^T
      EXPECT_FALSE(p[0]["b_kmajor"].get<bool>());
      EXPECT_EQ(p[1]["a"], 0);  // dW = X^T @ dY
      EXPECT_TRUE(p[1]["a_kmajor"].get<bool>());
    }
}

TEST(RecurrenceTemplates, AllGatherMatmulSharesTheGatheredOperand) {
  auto l = load("allgather", {"x", "w"});
  check_family(l, "shared_operand_matmul", "v5p");
}

TEST(RecurrenceTemplates, AttentionBackwardFromVjp) {
  auto l = load("attention_vjp", {"q", "k", "v", "d_out"});
  check_family(l, "attention_backward", "v6e");
}

TEST(RecurrenceTemplates, TopkThenSampling) {
  auto l = load("topk_sampling", {"logits", "uniform"});
  check_family(l, "topk", "v5e");
}

TEST(GraphFacts, ScalarArithmeticAndIndexValues) {
  auto l = load("retention", {"q", "k", "v"});
  const auto& g = *l.view;
  // the decay matrix is index-only: zero above the diagonal, gamma^(n-m) / sqrt(row sum) below
  ex::graph_facts::index_evaluator ev(g);
  int decay = -1;
  for (int d : g.find("div"))
    if (ev.index_only(ex::value_ref{ex::value_ref::kind::node, d, ""}) &&
        g.shape(ex::value_ref{ex::value_ref::kind::node, d, ""}).size() == 3)
      decay = d;
  ASSERT_GE(decay, 0);
  ex::value_ref v{ex::value_ref::kind::node, decay, ""};
  double gamma1 = 1.0 - std::pow(2.0, -6.0);  // head 1
  auto at = [&](int64_t h, int64_t n, int64_t m) { return *ev.at(v, {h, n, m}); };
  EXPECT_EQ(at(1, 3, 7), 0.0);
  double row = 0;
  for (int j = 0; j <= 5; ++j)
    row += std::pow(gamma1, j);
  EXPECT_NEAR(at(1, 5, 2), std::pow(gamma1, 3) / std::sqrt(row), 1e-6);
}
