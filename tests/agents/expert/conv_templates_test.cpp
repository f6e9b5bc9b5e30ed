// The convolution family of the expert brain (conv_gemm, jnp_replay) on analyze summaries of
// small references written by conv_data/make_graphs.py with the worker's own analyze(): what
// is recognised (epilogue, fused pool, channel-major layout, channel reductions, transposed
// convs), what is refused, the shape-generic jnp around the kernel (sizes read from arrays,
// a static group count, reduction counts), deterministic rendering, VMEM and three distinct
// playbook children. End-to-end kernels are in tests/agents/test_conv_templates.py.
#include "agents/expert/jnp_replay.hpp"
#include "agents/expert/playbook.hpp"
#include "agents/expert/template_registry.hpp"
#include "config/chip_loader.hpp"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
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

// The graph, and a native spec: one array input per graph input, the static arguments the
// reference took (position -> JSON value) in between.
loaded_graph load(const std::string& name, const std::map<unsigned, std::string>& statics = {}) {
  std::ifstream in(std::string(MAXKERNEL_CONV_TEST_DATA) + "/" + name + ".json");
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
  auto inputs = spec.initConfigurations(1)[0].initInputs(
      g.view->input_count() + static_cast<unsigned>(statics.size()));
  unsigned k = 0;
  for (unsigned i = 0; i < inputs.size(); ++i) {
    inputs[i].setName("x" + std::to_string(i));
    if (statics.count(i)) {
      inputs[i].setIsStatic(true);
      inputs[i].setStaticValue(statics.at(i));
    } else {
      inputs[i].setType(g.view->input_type(k++));
    }
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

std::optional<mx::template_match> conv_match(const loaded_graph& g) {
  return mx::find_template("conv_gemm")->match(*g.view, g.spec);
}

std::set<std::string> tunable_names(const mx::template_match& m) {
  std::set<std::string> names;
  for (const auto& u : mx::find_template("conv_gemm")->tunables(m))
    names.insert(u.name);
  return names;
}

}  // namespace

TEST(ConvGemm, NhwcConvBiasReluPoolFusesEverything) {
  auto g = load("nhwc_bias_relu_pool");
  auto m = conv_match(g);
  ASSERT_TRUE(m);
  EXPECT_NE(m->summary.find("2D conv 3x3 stride 1x1, 64 -> 128 channels, batch 2"),
            std::string::npos) << m->summary;
  EXPECT_NE(m->summary.find("+ max pool"), std::string::npos) << m->summary;
  EXPECT_EQ(m->summary.find("after as jnp"), std::string::npos) << m->summary;
  const auto& f = m->facts;
  EXPECT_FALSE(f["channel_major"].get<bool>());
  ASSERT_EQ(f["outs"].size(), 1u);
  // pool 2x2 stride 2 on both spatial dims; the cast after it is stored directly
  EXPECT_EQ(f["outs"][0]["pool"], nlohmann::json::parse("[[2,2,0,0],[2,2,0,0]]"));
  EXPECT_EQ(f["outs"][0]["dtype"], "bfloat16");
  EXPECT_EQ(f["conv"]["same"], true);
}

TEST(ConvGemm, NchwGroupNormTailIsShapeGeneric) {
  auto g = load("nchw_groupnorm", {{5, "8"}});
  auto m = conv_match(g);
  ASSERT_TRUE(m);
  const auto& f = m->facts;
  // the bias is the epilogue, in the channels-first order of the output
  EXPECT_TRUE(f["channel_major"].get<bool>());
  std::string tail = f["tail"];
  // the group split keeps the static group count and leaves C/G to -1; the means divide by
  // counts read from the kernel's result, never the configuration-0 literal 4096
  EXPECT_NE(tail.find(", 8, -1, outs[0].shape[2], outs[0].shape[3], )"), std::string::npos) << tail;
  EXPECT_NE(tail.find("outs[0].shape[2] * outs[0].shape[3]"), std::string::npos) << tail;
  EXPECT_EQ(tail.find("2048"), std::string::npos) << tail;
  EXPECT_EQ(tail.find(", 16, 16"), std::string::npos) << tail;
  EXPECT_EQ(f["result"], "t33");
}

TEST(ConvGemm, DepthwiseLayernormNeedsAllChannels) {
  auto g = load("depthwise_layernorm");
  auto m = conv_match(g);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->summary.rfind("depthwise 2D conv 7x7", 0), 0u) << m->summary;
  EXPECT_TRUE(m->facts["all_channels"].get<bool>());
  EXPECT_TRUE(m->facts["geometry"]["depthwise"].get<bool>());
  // no channel tile to tune when the epilogue reduces over channels, so no order of
  // channel tiles either
  auto t = mx::find_template("conv_gemm");
  auto names = tunable_names(*m);
  EXPECT_FALSE(names.count("block_n"));
  EXPECT_FALSE(names.count("grid_order"));
  // a bf16 input's window is converted to f32 once per step unless told per tap; the f32
  // copy costs VMEM
  EXPECT_TRUE(names.count("f32_window"));
  auto chip = v6e();
  auto p = t->initial_params(*m, chip);
  EXPECT_EQ(p.value("f32_window", false), true) << p.dump();
  // padded in VMEM, said so: the choice of padding offers HBM, not VMEM again (a kernel
  // the search has under another name)
  EXPECT_EQ(p.value("pad_in_kernel", false), true) << p.dump();
  for (const auto& mv : mx::playbook_moves(*t, *m, p, chip, nullptr, {}))
    EXPECT_NE(mv.params, p) << mv.name;
  auto per_tap = p;
  per_tap["f32_window"] = false;
  EXPECT_GT(t->vmem_bytes(*m, p), t->vmem_bytes(*m, per_tap));
  for (bool pad : {true, false}) {
    auto a = p, b = per_tap;
    a["pad_in_kernel"] = b["pad_in_kernel"] = pad;
    EXPECT_GT(t->vmem_bytes(*m, a), t->vmem_bytes(*m, b)) << pad;
  }
  auto bad = p;
  bad["f32_window"] = "yes";
  std::string src, err;
  EXPECT_FALSE(t->render(*m, bad, src, err));
  EXPECT_NE(err.find("f32_window"), std::string::npos) << err;
  // not for a conv on the MXU
  auto dense = load("nhwc_bias_relu_pool");
  auto dm = conv_match(dense);
  ASSERT_TRUE(dm);
  EXPECT_FALSE(tunable_names(*dm).count("f32_window"));
  EXPECT_FALSE(t->initial_params(*dm, chip).contains("f32_window"));
}

TEST(ConvGemm, TransposedConvAndPrologue) {
  auto t = load("conv_transpose_relu");
  auto m = conv_match(t);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->summary.rfind("transposed 2D conv 4x4 stride 2x2, 256 -> 128", 0), 0u)
      << m->summary;
  EXPECT_TRUE(m->facts["geometry"]["transposed"].get<bool>());

  // a group norm + SiLU before the conv runs as jnp that feeds the kernel
  auto g = load("groupnorm_silu_conv", {{2, "32"}});
  m = conv_match(g);
  ASSERT_TRUE(m);
  std::string pro = m->facts["prologue"];
  EXPECT_NE(pro.find("32, -1, )"), std::string::npos) << pro;
  EXPECT_NE(pro.find("lhs = p"), std::string::npos) << pro;
  EXPECT_NE(m->summary.find("before as jnp"), std::string::npos) << m->summary;
}

TEST(ConvGemm, TransposedConvPhasesInOneStepWhenTheyFit) {
  auto g = load("conv_transpose_relu");
  auto m = conv_match(g);
  ASSERT_TRUE(m);
  auto t = mx::find_template("conv_gemm");
  auto names = tunable_names(*m);
  EXPECT_TRUE(names.count("phases_in_step"));
  // its phases read a row before the input ("SAME", 4x4 stride 2): padded in VMEM or in HBM
  EXPECT_TRUE(names.count("pad_in_kernel"));
  auto chip = v6e();
  auto p = t->initial_params(*m, chip);
  EXPECT_EQ(p.value("phases_in_step", false), true) << p.dump();
  auto in_hbm = p;
  in_hbm["pad_in_kernel"] = false;
  EXPECT_GT(t->vmem_bytes(*m, p), t->vmem_bytes(*m, in_hbm));
  // every phase's weights and output tile at once: more VMEM than one phase's
  auto one = p;
  one["phases_in_step"] = false;
  EXPECT_GT(t->vmem_bytes(*m, p), t->vmem_bytes(*m, one));
  auto bad = p;
  bad["phases_in_step"] = 1;
  std::string src, err;
  EXPECT_FALSE(t->render(*m, bad, src, err));
  EXPECT_NE(err.find("phases_in_step"), std::string::npos) << err;
  // a direct conv has one phase: nothing to choose
  auto dense = load("nhwc_bias_relu_pool");
  auto dm = conv_match(dense);
  ASSERT_TRUE(dm);
  EXPECT_FALSE(tunable_names(*dm).count("phases_in_step"));
}

TEST(ConvGemm, StridedDepthwiseIsPaddedInVmemWithItsF32Window) {
  auto g = load("depthwise_s2");
  auto m = conv_match(g);
  ASSERT_TRUE(m);
  auto t = mx::find_template("conv_gemm");
  auto names = tunable_names(*m);
  // the f32 window is read with the stride in VMEM: the input is not split into phases in
  // HBM, so its padding can be done in VMEM too
  EXPECT_TRUE(names.count("f32_window"));
  EXPECT_TRUE(names.count("pad_in_kernel"));
  auto chip = v6e();
  auto p = t->initial_params(*m, chip);
  EXPECT_EQ(p.value("f32_window", false), true) << p.dump();
  EXPECT_LE(t->vmem_bytes(*m, p), static_cast<int64_t>(chip.scoped_vmem_bytes));
  // a window of 8 output rows spans 2 * 7 + 5 input rows: more than one of 4 rows
  auto rows8 = p, rows4 = p;
  rows8["block_s0"] = 8;
  rows4["block_s0"] = 4;
  EXPECT_GT(t->vmem_bytes(*m, rows8), t->vmem_bytes(*m, rows4));
  std::string src, err;
  for (const auto& mv : mx::playbook_moves(*t, *m, p, chip, nullptr, {}))
    EXPECT_TRUE(t->render(*m, mv.params, src, err)) << mv.name << ": " << err;
}

TEST(ConvGemm, SeveralImagesPerStepCostTheirWindowsAndTiles) {
  auto g = load("nhwc_bias_relu_pool");
  auto m = conv_match(g);
  ASSERT_TRUE(m);
  auto t = mx::find_template("conv_gemm");
  EXPECT_TRUE(tunable_names(*m).count("block_b"));
  auto chip = v6e();
  auto p = t->initial_params(*m, chip);
  EXPECT_EQ(p.value("block_b", 0), 1) << p.dump();
  auto two = p;
  two["block_b"] = 2;
  // the padded window is one scratch for the step's images; the rest doubles
  EXPECT_GT(t->vmem_bytes(*m, two), t->vmem_bytes(*m, p));
  EXPECT_LT(t->vmem_bytes(*m, two), 2 * t->vmem_bytes(*m, p));
}

// The graph holds explicit pads. Where they also equal what SAME gives at these sizes and a
// dim is strided, the two readings part at other sizes (the tester's ragged ones): a
// symmetric split is the constant padding written out (VALID, PyTorch's padding=p); an
// asymmetric one is SAME, recomputed from the input size at trace time.
TEST(ConvGemm, StridedPadsAreSameOnlyWhenTheirSplitIsUneven) {
  auto v = load("patch4_valid");
  auto m = conv_match(v);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->facts["conv"]["same"], false);
  EXPECT_EQ(m->facts["conv"]["padding"], nlohmann::json::parse("[[0,0],[0,0]]"));
  auto p = load("k4s2_pad1");
  m = conv_match(p);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->facts["conv"]["same"], false);
  auto s = load("k3s2_same");
  m = conv_match(s);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->facts["conv"]["same"], true);
  EXPECT_EQ(m->facts["conv"]["padding"], nlohmann::json::parse("[[0,1],[0,1]]"));
  // the same reading for a fused max pool's pads: a "SAME" 3x3 stride-2 pool is (0, 1) here
  auto q = load("same_pool");
  m = conv_match(q);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->facts["outs"].size(), 1u);
  EXPECT_EQ(m->facts["outs"][0]["pool"], nlohmann::json::parse("[[3,2,0,1],[3,2,0,1]]"));
  EXPECT_EQ(m->facts["outs"][0]["pool_same"], true);
  // a VALID 2x2 pool (nhwc_bias_relu_pool) keeps its constant pads
  auto v2 = load("nhwc_bias_relu_pool");
  m = conv_match(v2);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->facts["outs"][0]["pool_same"], false);
}

TEST(ConvGemm, RefusesNoConvAndWideGroupedConvs) {
  EXPECT_FALSE(conv_match(load("matmul_relu")));
  EXPECT_FALSE(conv_match(load("grouped16")));
}

TEST(ConvGemm, RendersDeterministicallyFitsVmemAndHasThreeChildren) {
  auto chip = v6e();
  auto t = mx::find_template("conv_gemm");
  for (const char* name : {"nhwc_bias_relu_pool", "depthwise_layernorm", "conv_transpose_relu"}) {
    auto g = load(name);
    auto m = conv_match(g);
    ASSERT_TRUE(m) << name;
    auto params = t->initial_params(*m, chip);
    EXPECT_LE(t->vmem_bytes(*m, params), static_cast<int64_t>(chip.scoped_vmem_bytes)) << name;
    std::string a, b, err;
    ASSERT_TRUE(t->render(*m, params, a, err)) << err;
    ASSERT_TRUE(t->render(*m, params, b, err)) << err;
    EXPECT_EQ(a, b);
    EXPECT_EQ(a.rfind("# maxkernel expert template: conv_gemm", 0), 0u);
    EXPECT_EQ(a.find("{{"), std::string::npos);
    auto moves = mx::playbook_moves(*t, *m, params, chip, nullptr, {});
    std::set<std::string> distinct;
    for (const auto& mv : moves) {
      std::string src;
      EXPECT_TRUE(t->render(*m, mv.params, src, err)) << name << " " << mv.name << ": " << err;
      distinct.insert(mx::params_key(t->name(), mv.params));
    }
    EXPECT_GE(distinct.size(), 3u) << name;
  }
  // more rows per tile, more VMEM; a bad parameter is an error, not a crash
  auto g = load("nhwc_bias_relu_pool");
  auto m = conv_match(g);
  ASSERT_TRUE(m);
  auto p = t->initial_params(*m, chip);
  auto small = p, big = p;
  small["block_s0"] = 2;
  big["block_s0"] = 16;
  EXPECT_LT(t->vmem_bytes(*m, small), t->vmem_bytes(*m, big));
  auto bad = p;
  bad["fold"] = 7;
  std::string src, err;
  EXPECT_FALSE(t->render(*m, bad, src, err));
  EXPECT_NE(err.find("fold"), std::string::npos);
}
