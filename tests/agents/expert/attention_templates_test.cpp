// The attention family of the expert brain (loop_index_space, attention_pattern,
// flash_attention, paged_attention) on analyze summaries of small references written by
// attention_data/make_graphs.py with the worker's own analyze(): what is recognised in each
// spelling, what is refused, deterministic rendering, VMEM, three distinct playbook children,
// scales written over the sizes, one iota read as rows and keys. End-to-end kernels (lowered
// and tested) are in tests/agents/test_attention_templates.py.
#include "agents/expert/attention_pattern.hpp"
#include "agents/expert/loop_index_space.hpp"
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

namespace mx = maxkernel::agents::expert;

namespace {

struct loaded_graph {
  std::unique_ptr<capnp::MallocMessageBuilder> message;
  std::unique_ptr<mx::graph_view> view;
  std::unique_ptr<capnp::MallocMessageBuilder> spec_message;
  maxkernel::schema::KernelSpec::Reader spec;
};

// The graph, and a native spec with one array input per graph input.
loaded_graph load(const std::string& name) {
  std::ifstream in(std::string(MAXKERNEL_ATTENTION_TEST_DATA) + "/" + name + ".json");
  std::stringstream text;
  text << in.rdbuf();
  loaded_graph g;
  g.message = std::make_unique<capnp::MallocMessageBuilder>();
  auto root = g.message->initRoot<maxkernel::schema::DataflowGraph>();
  capnp::JsonCodec codec;
  codec.decode(kj::StringPtr(text.str().c_str()), root);
  g.view = std::make_unique<mx::graph_view>(root.asReader());
  g.spec_message = std::make_unique<capnp::MallocMessageBuilder>();
  auto spec = g.spec_message->initRoot<maxkernel::schema::KernelSpec>();
  spec.setName(name);
  auto inputs = spec.initConfigurations(1)[0].initInputs(g.view->input_count());
  for (unsigned k = 0; k < g.view->input_count(); ++k) {
    inputs[k].setName("x" + std::to_string(k));
    inputs[k].setType(g.view->input_type(k));
  }
  g.spec = spec.asReader();
  return g;
}

maxkernel::config::chip v6e() {
  maxkernel::config::chip c;
  maxkernel::config::spec_error err;
  EXPECT_TRUE(maxkernel::config::load_chip("v6e", c, err));
  return c;
}

std::vector<int64_t> sizes(const mx::attention_pattern& p, const mx::index_list& l) {
  std::vector<int64_t> out;
  for (int x : l)
    out.push_back(p.space.size(x));
  return out;
}

}  // namespace

TEST(LoopIndexSpace, ReshapeSplitRefinesAnIndexEverywhere) {
  mx::loop_index_space s;
  int h = s.make(12), d = s.make(64);
  mx::axis_indices groups;
  ASSERT_TRUE(s.partition({h, d}, {3, 4, 64}, groups));
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_FALSE(s.is_leaf(h));
  auto leaves = s.expand(mx::index_list{h});
  ASSERT_EQ(leaves.size(), 2u);
  EXPECT_EQ(s.size(leaves[0]), 3);
  EXPECT_EQ(s.size(leaves[1]), 4);
  EXPECT_EQ(groups[0], mx::index_list{leaves[0]});
  EXPECT_EQ(groups[2], mx::index_list{d});
  EXPECT_EQ(s.product({h, d}), 12 * 64);
  // a merge is the concatenation; a size that does not factor is refused
  ASSERT_TRUE(s.partition({h, d}, {12 * 64}, groups));
  EXPECT_EQ(groups[0].size(), 3u);
  EXPECT_FALSE(s.partition({h, d}, {5, 64}, groups));
  EXPECT_FALSE(s.partition({h}, {12, 2}, groups));
}

TEST(AttentionPattern, CausalEinsumBhsd) {
  auto g = load("causal_bhsd");
  std::string why;
  auto p = mx::find_attention(*g.view, why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(sizes(*p, p->keys), (std::vector<int64_t>{256}));
  EXPECT_EQ(sizes(*p, p->kv_rows), (std::vector<int64_t>{2, 4}));   // batch, heads
  EXPECT_EQ(sizes(*p, p->q_rows), (std::vector<int64_t>{256}));     // query positions
  EXPECT_EQ(p->terms.size(), 1u);
  EXPECT_EQ(sizes(*p, p->value_dims), (std::vector<int64_t>{128}));
  EXPECT_EQ(p->epilogue_from, -1);
  EXPECT_EQ(p->out_dtype, "bfloat16");
}

TEST(AttentionPattern, GqaByRepeatFoldsTheGroupIntoRows) {
  auto g = load("gqa_repeat_bshd");
  std::string why;
  auto p = mx::find_attention(*g.view, why);
  ASSERT_TRUE(p) << why;
  // 8 query heads over 2 kv heads: the kv side depends on (batch, kv head); the group of 4
  // and the positions are rows of the query side only
  EXPECT_EQ(sizes(*p, p->kv_rows), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(sizes(*p, p->q_rows), (std::vector<int64_t>{4, 128}));
  EXPECT_FALSE(p->deferred_norm);
}

TEST(AttentionPattern, PagedCacheSplitsTheKeys) {
  auto g = load("paged_decode");
  std::string why;
  auto p = mx::find_attention(*g.view, why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(sizes(*p, p->keys), (std::vector<int64_t>{16, 16}));  // page slots x rows of a page
  EXPECT_EQ(sizes(*p, p->q_rows), (std::vector<int64_t>{4}));      // the group, one token
  EXPECT_TRUE(p->terms[0].k.base.is_node());                      // the gather
}

TEST(AttentionPattern, TwoScoreTermsAndAnEpilogue) {
  auto g = load("two_terms_projected");
  std::string why;
  auto p = mx::find_attention(*g.view, why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(p->terms.size(), 2u);
  EXPECT_EQ(sizes(*p, p->kv_rows), (std::vector<int64_t>{4}));
  EXPECT_EQ(sizes(*p, p->q_rows), (std::vector<int64_t>{16}));
  EXPECT_GE(p->epilogue_from, 0);  // the W_UV projection after the attention
}

TEST(AttentionPattern, SoftmaxWithoutValuesIsNotAttention) {
  auto g = load("softmax_of_matmul");
  std::string why;
  EXPECT_FALSE(mx::find_attention(*g.view, why));
  EXPECT_FALSE(why.empty());
}

TEST(AttentionTemplates, WhichFamilyMatchesWhat) {
  auto flash = mx::find_template("flash_attention");
  auto paged = mx::find_template("paged_attention");
  ASSERT_TRUE(flash && paged);
  for (const char* name : {"causal_bhsd", "gqa_repeat_bshd", "two_terms_projected"}) {
    auto g = load(name);
    EXPECT_TRUE(flash->match(*g.view, g.spec)) << name;
    EXPECT_FALSE(paged->match(*g.view, g.spec)) << name;
  }
  auto g = load("paged_decode");
  EXPECT_FALSE(flash->match(*g.view, g.spec));
  auto m = paged->match(*g.view, g.spec);
  ASSERT_TRUE(m);
  EXPECT_NE(m->summary.find("mask data-dependent"), std::string::npos) << m->summary;
  auto s = load("softmax_of_matmul");
  EXPECT_FALSE(flash->match(*s.view, s.spec));
  EXPECT_FALSE(paged->match(*s.view, s.spec));
}

TEST(AttentionTemplates, RenderIsDeterministicAndSizedFromTheInputs) {
  auto flash = mx::find_template("flash_attention");
  auto g = load("causal_bhsd");
  auto m = flash->match(*g.view, g.spec);
  ASSERT_TRUE(m);
  EXPECT_NE(m->summary.find("mask static"), std::string::npos) << m->summary;
  auto chip = v6e();
  auto params = flash->initial_params(*m, chip);
  std::string a, b, err;
  ASSERT_TRUE(flash->render(*m, params, a, err)) << err;
  ASSERT_TRUE(flash->render(*m, params, b, err)) << err;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.rfind("# flash_attention template", 0), 0u);
  EXPECT_EQ(a.find("{{"), std::string::npos);
  EXPECT_NE(a.find("def workload(a0, a1, a2):"), std::string::npos);
  // sizes come from the inputs at trace time, never the analysed full sizes
  EXPECT_NE(a.find("a0.shape["), std::string::npos);
  EXPECT_EQ(a.find("256, 128"), std::string::npos);
  // a parameter out of range is an error naming it
  auto bad = params;
  bad["pv_dtype"] = "int8";
  EXPECT_FALSE(flash->render(*m, bad, a, err));
  EXPECT_NE(err.find("pv_dtype"), std::string::npos);
}

TEST(AttentionTemplates, VmemGrowsWithBlocksAndThePlaybookHasThreeChildren) {
  auto chip = v6e();
  for (const char* name : {"causal_bhsd", "paged_decode"}) {
    auto g = load(name);
    auto matches = mx::match_templates(*g.view, g.spec);
    ASSERT_FALSE(matches.empty()) << name;
    const auto& t = *matches[0].tmpl;
    const auto& m = matches[0].match;
    auto params = t.initial_params(m, chip);
    EXPECT_LE(t.vmem_bytes(m, params), static_cast<int64_t>(chip.scoped_vmem_bytes)) << name;
    auto tunables = t.tunables(m);
    ASSERT_FALSE(tunables.empty());
    auto moves = mx::playbook_moves(t, m, params, chip, nullptr, {});
    std::set<std::string> distinct;
    for (const auto& mv : moves) {
      std::string src, err;
      EXPECT_TRUE(t.render(m, mv.params, src, err)) << name << " " << mv.name << ": " << err;
      distinct.insert(mx::params_key(t.name(), mv.params));
      // v6e has one TensorCore: a row axis's semantics would not change the kernel's schedule.
      EXPECT_FALSE(mv.changes.contains("row_semantics")) << name << " " << mv.name;
    }
    EXPECT_GE(distinct.size(), 3u) << name;
  }
  auto flash = mx::find_template("flash_attention");
  auto g = load("causal_bhsd");
  auto m = flash->match(*g.view, g.spec);
  ASSERT_TRUE(m);
  nlohmann::json small = {{"block_q", 64}, {"block_k", 128}}, big = {{"block_q", 256}, {"block_k", 256}};
  EXPECT_LT(flash->vmem_bytes(*m, small), flash->vmem_bytes(*m, big));
}

TEST(AttentionTemplates, AScaleTheReferenceComputedFromSizesIsAFormulaOverThem) {
  auto flash = mx::find_template("flash_attention");
  auto chip = v6e();
  std::string src, err;
  // (d_nope + d_rope) ** -0.5 with d_nope contracted only by the absorbed W_UK product (the
  // replayed prologue): written from the inputs' shapes, not as 1/sqrt(192)
  auto g = load("mla_absorb_scale");
  auto m = flash->match(*g.view, g.spec);
  ASSERT_TRUE(m);
  ASSERT_TRUE(flash->render(*m, flash->initial_params(*m, chip), src, err)) << err;
  EXPECT_NE(src.find(".shape[1] + n"), std::string::npos) << src;
  EXPECT_NE(src.find(") ** -0.5)"), std::string::npos);
  EXPECT_EQ(src.find("0.0721"), std::string::npos);
  // a constant no size explains (0.1) stays a constant
  auto c = load("two_terms_projected");
  auto mc = flash->match(*c.view, c.spec);
  ASSERT_TRUE(mc);
  ASSERT_TRUE(flash->render(*mc, flash->initial_params(*mc, chip), src, err)) << err;
  EXPECT_NE(src.find(" * 0.1"), std::string::npos) << src;
  EXPECT_EQ(src.find(") ** -0.5)"), std::string::npos);
}

TEST(AttentionPattern, OneArangeReadAsRowsAndAsKeys) {
  auto g = load("one_arange_causal");
  std::string why;
  auto p = mx::find_attention(*g.view, why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(p->iota_reads.size(), 1u);
  auto flash = mx::find_template("flash_attention");
  auto m = flash->match(*g.view, g.spec);
  ASSERT_TRUE(m);
  // the rows' and the keys' positions of one iota: a causal (static, row-dependent) mask
  EXPECT_NE(m->summary.find("mask static"), std::string::npos) << m->summary;
  std::string src, err;
  ASSERT_TRUE(flash->render(*m, flash->initial_params(*m, v6e()), src, err)) << err;
  EXPECT_NE(src.find("ix.k()"), std::string::npos);
  EXPECT_NE(src.find("ix.r("), std::string::npos);
  EXPECT_NE(src.find("kill_rows=True"), std::string::npos);
}
