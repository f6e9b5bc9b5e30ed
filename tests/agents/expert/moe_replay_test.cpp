// The pieces the mixture-of-experts and gated-MLP templates build on, on analyze summaries of
// small references (tests/agents/expert/moe_data, written by make_graphs.py): shape-generic
// sizes (dim_symbols), the replay of light graph work as jax.lax code, the replay on kernel
// blocks with the reference's bf16 rounding, and the one-hot / gathered-weights recognisers.
#include "agents/expert/dim_symbols.hpp"
#include "agents/expert/fused_epilogue.hpp"
#include "agents/expert/moe_patterns.hpp"
#include "agents/expert/replay_program.hpp"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>

namespace mx = maxkernel::agents::expert;
namespace moe = maxkernel::agents::expert::moe;

namespace {

struct loaded_graph {
  std::unique_ptr<capnp::MallocMessageBuilder> message;
  std::unique_ptr<mx::graph_view> view;
};

loaded_graph load(const std::string& name) {
  std::ifstream in(std::string(MAXKERNEL_MOE_TEST_DATA) + "/" + name + ".json");
  std::stringstream text;
  text << in.rdbuf();
  loaded_graph g;
  g.message = std::make_unique<capnp::MallocMessageBuilder>();
  auto root = g.message->initRoot<maxkernel::schema::DataflowGraph>();
  capnp::JsonCodec codec;
  codec.decode(kj::StringPtr(text.str().c_str()), root);
  g.view = std::make_unique<mx::graph_view>(root.asReader());
  return g;
}

mx::value_ref node(int id) { return mx::value_ref{mx::value_ref::kind::node, id, ""}; }

bool has(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

int first(const mx::graph_view& g, const std::string& primitive) {
  auto ids = g.find(primitive);
  return ids.empty() ? -1 : ids.front();
}

}  // namespace

TEST(MoeReplay, RoutingReplaysWithSizesReadFromTheInputs) {
  auto g = load("dense_moe");
  moe::dim_symbols dims(*g.view, {"x", "w_router", "w_gate", "w_up", "w_down"});
  // The one-hot's iota over the 8 experts is tied to an expert dim, not a literal 8.
  int iota = first(*g.view, "iota");
  ASSERT_GE(iota, 0);
  auto iota_shape = dims.shape_expr(node(iota));
  EXPECT_TRUE(has(iota_shape, "w_router.shape[1]") || has(iota_shape, "w_gate.shape[0]"))
      << iota_shape;
  // Replay the combine weights: the routing only (the expert MLPs are not needed).
  int combine = -1;
  for (int id : g.view->find("dot_general"))
    combine = id;  // the last dot_general contracts the experts with the combine weights
  ASSERT_GE(combine, 0);
  auto weights = g.view->operand(combine, 1);
  moe::replay_request req;
  req.inputs = {"x", "w_router", "w_gate", "w_up", "w_down"};
  req.outputs = {weights};
  moe::replay_code code;
  std::string why;
  ASSERT_TRUE(moe::build_replay(*g.view, dims, req, code, why)) << why;
  auto text = code.code(0);
  EXPECT_TRUE(has(text, "lax.top_k(")) << text;
  EXPECT_TRUE(has(text, "x.shape[0], x.shape[1]")) << text;  // broadcast shapes from x
  EXPECT_FALSE(has(text, "64")) << text;                     // no traced size baked in
  EXPECT_FALSE(has(text, "w_gate,")) << text;                // the experts are not replayed
  EXPECT_LT(code.flops, 0.1 * g.view->raw().getFlops());
}

TEST(MoeReplay, ExpertProductsCannotBeReplayedOnBlocks) {
  auto g = load("dense_moe");
  moe::dim_symbols dims(*g.view, {"x", "w_router", "w_gate", "w_up", "w_down"});
  moe::replay_request req;
  req.block_mode = true;
  req.outputs = {g.view->output(0)};
  moe::replay_code code;
  std::string why;
  EXPECT_FALSE(moe::build_replay(*g.view, dims, req, code, why));
  EXPECT_FALSE(why.empty());
}

TEST(MoeReplay, UntiedSizeNeedsOneNameOrTaskReducedByValue) {
  auto g = load("iota_of_equal_sizes");
  int iota = first(*g.view, "iota");
  ASSERT_GE(iota, 0);
  moe::dim_symbols dims(*g.view, {"a", "b"});
  // 8 is a size of a (axis 1) and of b (axis 0), tied to neither by the primitives
  EXPECT_EQ(dims.dim_expr(node(iota), 0), "");
  dims.set_size_names({{"M", "N"}, {"C"}}, false);
  EXPECT_EQ(dims.dim_expr(node(iota), 0), "");  // two names: which one it is is unknown
  dims.set_size_names({{"M", "N"}, {"N"}}, false);
  EXPECT_EQ(dims.dim_expr(node(iota), 0), "a.shape[1]");
  dims.set_size_names({}, true);  // equal sizes reduce alike
  EXPECT_EQ(dims.dim_expr(node(iota), 0), "a.shape[1]");
}

TEST(MoeReplay, BlockModeRoundsBf16OpsAsTheReferenceDoes) {
  auto g = load("dense_moe");
  moe::dim_symbols dims(*g.view, {"x", "w_router", "w_gate", "w_up", "w_down"});
  int logistic = first(*g.view, "logistic");
  ASSERT_GE(logistic, 0);
  // silu(gate) * up: the mul reading the logistic's input and output, then the mul by up
  int gate = g.view->operand(logistic, 0).id;
  int glu = -1;
  for (int id : g.view->find("mul"))
    if (g.view->dtype(node(id)) == "bfloat16")
      glu = id;
  ASSERT_GE(glu, 0);
  int up = -1;
  for (unsigned k = 0; k < 2; ++k)
    if (g.view->primitive(g.view->operand(glu, k).id) == "dot_general")
      up = g.view->operand(glu, k).id;
  ASSERT_GE(up, 0);
  moe::replay_request req;
  req.block_mode = true;
  req.given = {{gate, "g"}, {up, "u"}};
  req.outputs = {node(glu)};
  moe::replay_code code;
  std::string why;
  ASSERT_TRUE(moe::build_replay(*g.view, dims, req, code, why)) << why;
  auto text = code.code(0);
  // logistic as XLA evaluates it in bf16: exp, 1 + _, 1 / _, each rounded
  EXPECT_TRUE(has(text, "(1.0 / (1.0 + (jnp.exp(-g)).astype(jnp.bfloat16)")) << text;
  EXPECT_TRUE(has(text, " * u)).astype(jnp.bfloat16).astype(jnp.float32)")) << text;
}

TEST(MoeReplay, F32GluOnBlocksIsNotRounded) {
  auto g = load("glu_f32");
  moe::dim_symbols dims(*g.view, {"x", "wg", "wu"});
  auto dots = g.view->find("dot_general");
  ASSERT_EQ(dots.size(), 2u);
  moe::replay_request req;
  req.block_mode = true;
  req.given = {{dots[0], "g"}, {dots[1], "u"}};
  req.outputs = {g.view->output(0)};
  moe::replay_code code;
  std::string why;
  ASSERT_TRUE(moe::build_replay(*g.view, dims, req, code, why)) << why;
  auto text = code.code(0);
  EXPECT_TRUE(has(text, "lax.logistic(g)")) << text;
  EXPECT_FALSE(has(text, "astype")) << text;
  // The epilogue builder hands an f32 chain to block_program.
  moe::epilogue_request er;
  er.space.resize(2);
  er.space[0].factors = {128};
  er.space[0].factor_exprs = {"x.shape[0]"};
  er.space[1].factors = {512};
  er.space[1].factor_exprs = {"wg.shape[1]"};
  for (int d : dots) {
    mx::block_seed s;
    s.value = node(d);
    ASSERT_TRUE(mx::map_dims_to_factors({128, 512}, er.space, s.dims));
    er.seeds.push_back(s);
  }
  er.ends = moe::chain_ends(*g.view, g.view->output(0).id);
  er.name = "_glu";
  std::string notes;
  auto fe = moe::build_fused_epilogue(*g.view, dims, er, notes);
  EXPECT_EQ(fe.end, g.view->output(0).id) << notes;
  EXPECT_EQ(fe.how, "block_program") << notes;
  EXPECT_TRUE(has(fe.code, "def _glu(accs, extras, offsets, extents):")) << fe.code;
}

TEST(MoePatterns, OneHotOfTopKIndicesAndGatheredWeights) {
  auto moe_graph = load("dense_moe");
  auto& g = *moe_graph.view;
  // jax.nn.one_hot(top_experts, 8): a cast of eq(ids, iota) along the last axis
  int eq = first(g, "eq");
  ASSERT_GE(eq, 0);
  int cast = g.consumers(eq).at(0);
  auto oh = moe::match_one_hot(g, node(cast));
  ASSERT_TRUE(oh.has_value());
  EXPECT_EQ(oh->classes, 8);
  EXPECT_EQ(oh->class_axis, 3);
  ASSERT_TRUE(oh->ids.is_node());
  EXPECT_EQ(g.primitive(oh->ids.id), "top_k");
  EXPECT_FALSE(moe::match_one_hot(g, g.output(0)).has_value());

  auto gw = load("gathered_weights");
  int dot = first(*gw.view, "dot_general");
  auto sel = moe::match_selected_weights(*gw.view, gw.view->operand(dot, 1));
  ASSERT_TRUE(sel.has_value());
  EXPECT_TRUE(sel->weights.is_input() && sel->weights.id == 1);
  // the ids behind jnp's negative-index wrap and the (M, 1) broadcast
  EXPECT_TRUE(sel->ids.is_input() && sel->ids.id == 2);
  EXPECT_EQ(sel->row_axis, 0);
  EXPECT_FALSE(moe::match_selected_weights(*gw.view, gw.view->operand(dot, 0)).has_value());
}
