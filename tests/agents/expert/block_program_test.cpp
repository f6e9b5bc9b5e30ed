// The block code generator on analyze summaries of small references (written by
// data/make_graphs.py with the worker's own analyze()).
#include "agents/expert/block_program.hpp"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

namespace mx = maxkernel::agents::expert;

namespace {

struct loaded_graph {
  std::unique_ptr<capnp::MallocMessageBuilder> message;
  std::unique_ptr<mx::graph_view> view;
};

loaded_graph load(const std::string& name) {
  std::ifstream in(std::string(MAXKERNEL_EXPERT_TEST_DATA) + "/" + name + ".json");
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

mx::space_axis axis(std::vector<int64_t> factors, std::vector<std::string> exprs) {
  mx::space_axis a;
  a.factors = std::move(factors);
  a.factor_exprs = std::move(exprs);
  return a;
}

mx::value_ref node_ref(int id) {
  mx::value_ref v;
  v.what = mx::value_ref::kind::node;
  v.id = id;
  return v;
}

mx::value_ref input_ref(int id) {
  mx::value_ref v;
  v.what = mx::value_ref::kind::input;
  v.id = id;
  return v;
}

// A matmul's request: the first dot_general is the seed over space (M, N).
mx::block_request matmul_request(const mx::graph_view& g, int stream_axis = -1) {
  mx::block_request r;
  int dot = g.find("dot_general").at(0);
  auto shape = g.shape(node_ref(dot));
  r.space = {axis({shape[0]}, {"x.shape[0]"}), axis({shape[1]}, {"w.shape[1]"})};
  mx::block_seed s;
  s.value = node_ref(dot);
  EXPECT_TRUE(mx::map_dims_to_factors(shape, r.space, s.dims));
  r.seeds = {s};
  for (unsigned k = 0; k < g.output_count(); ++k)
    r.outputs.push_back(g.output(k));
  r.name = "epi";
  r.stream_axis = stream_axis;
  return r;
}

bool has(const std::string& code, const std::string& piece) {
  return code.find(piece) != std::string::npos;
}

}  // namespace

TEST(BlockProgram, MapsDimsToFactors) {
  std::vector<mx::space_axis> space = {axis({2, 8}, {"a", "b"}), axis({128}, {"c"})};
  std::vector<mx::dim_map> dims;
  ASSERT_TRUE(mx::map_dims_to_factors({2, 8, 128}, space, dims));
  EXPECT_EQ(dims[0], (mx::dim_map{0, 0, 1}));
  EXPECT_EQ(dims[1], (mx::dim_map{0, 1, 2}));
  EXPECT_EQ(dims[2], (mx::dim_map{1, 0, 1}));
  ASSERT_TRUE(mx::map_dims_to_factors({16, 1, 128}, space, dims));  // merged rows, a unit dim
  EXPECT_EQ(dims[0], (mx::dim_map{0, 0, 2}));
  EXPECT_TRUE(dims[1].unit());
  EXPECT_FALSE(mx::map_dims_to_factors({4, 4, 128}, space, dims));  // splits a factor
  EXPECT_FALSE(mx::map_dims_to_factors({16}, space, dims));         // misses an axis
  EXPECT_EQ(space[0].extent(), 16);
  EXPECT_EQ(space[0].extent_expr(), "(a * b)");
}

TEST(BlockProgram, MatmulEpilogueWithBiasGeluAndRowSoftmax) {
  auto g = load("matmul_bias_gelu_softmax");
  auto req = matmul_request(*g.view, 1);
  mx::block_program p;
  std::string why;
  ASSERT_TRUE(mx::build_block_program(*g.view, req, p, why)) << why;
  ASSERT_EQ(p.operands.size(), 1u);
  EXPECT_EQ(p.operands[0].input, 2);  // the bias
  EXPECT_EQ(p.operands[0].present, (std::vector<bool>{false, true}));
  EXPECT_EQ(p.operands[0].space_shape, "(1, w.shape[1])");
  EXPECT_EQ(p.reduced, (std::vector<bool>{false, true}));
  ASSERT_EQ(p.outputs.size(), 1u);
  EXPECT_EQ(p.outputs[0].dtype, "bfloat16");
  EXPECT_EQ(p.outputs[0].ref_shape, "(x.shape[0], w.shape[1])");
  EXPECT_TRUE(has(p.code, "def epi(seeds, extras, offsets, extents):")) << p.code;
  EXPECT_TRUE(has(p.code, "jnp.max(")) << p.code;
  EXPECT_TRUE(has(p.code, "jnp.sum(")) << p.code;
  EXPECT_TRUE(has(p.code, "jnp.tanh(")) << p.code;  // jax.nn.gelu's tanh form
  // The softmax output spans the row: no streamed form.
  EXPECT_FALSE(p.streamable);
  EXPECT_FALSE(p.stream_refusal.empty());
}

TEST(BlockProgram, RmsnormOverMergedRowsUsesRuntimeCount) {
  auto g = load("rmsnorm_3d");
  mx::block_request r;
  r.space = {axis({4, 256}, {"x.shape[0]", "x.shape[1]"}), axis({512}, {"x.shape[2]"})};
  mx::block_seed s;
  s.value = input_ref(0);
  ASSERT_TRUE(mx::map_dims_to_factors({4, 256, 512}, r.space, s.dims));
  r.seeds = {s};
  r.outputs = {g.view->output(0)};
  mx::block_program p;
  std::string why;
  ASSERT_TRUE(mx::build_block_program(*g.view, r, p, why)) << why;
  ASSERT_EQ(p.operands.size(), 1u);
  EXPECT_EQ(p.operands[0].input, 1);
  EXPECT_EQ(p.operands[0].space_shape, "(1, x.shape[2])");
  // The mean's divisor is the row length at run time, not the 512 of the traced shapes.
  EXPECT_TRUE(has(p.code, "extents[1]")) << p.code;
  EXPECT_FALSE(has(p.code, "512")) << p.code;
  EXPECT_TRUE(has(p.code, "jax.lax.rsqrt(")) << p.code;
  EXPECT_EQ(p.outputs[0].ref_shape, "(x.shape[0], x.shape[1], x.shape[2])");
  // eps was a static argument: a literal in the code.
  EXPECT_TRUE(has(p.code, "9.99999997")) << p.code;
}

TEST(BlockProgram, CrossEntropyStreamsOverTheVocabulary) {
  auto g = load("cross_entropy");
  auto req = matmul_request(*g.view, 1);
  mx::block_program p;
  std::string why;
  ASSERT_TRUE(mx::build_block_program(*g.view, req, p, why)) << why;
  ASSERT_EQ(p.operands.size(), 1u);
  EXPECT_EQ(p.operands[0].input, 2);  // the labels: one per row
  EXPECT_EQ(p.operands[0].present, (std::vector<bool>{true, false}));
  EXPECT_EQ(p.operands[0].space_shape, "(x.shape[0], 1)");
  EXPECT_EQ(p.outputs[0].ref_shape, "(x.shape[0],)");
  EXPECT_EQ(p.outputs[0].present, (std::vector<bool>{true, false}));
  // take_along_axis -> a one-hot pick with global column indices; the label wrap-around
  // adds the vocabulary's runtime extent.
  EXPECT_TRUE(has(p.code, "broadcasted_iota")) << p.code;
  EXPECT_TRUE(has(p.code, "offsets[1]")) << p.code;
  EXPECT_TRUE(has(p.code, "extents[1]")) << p.code;
  EXPECT_FALSE(has(p.code, "4096")) << p.code;
  ASSERT_TRUE(p.streamable) << p.stream_refusal;
  EXPECT_EQ(p.accumulators, 3);  // running max, picked logit, online sum of exp
  EXPECT_TRUE(has(p.stream_code, "def epi_init(row_shape):")) << p.stream_code;
  EXPECT_TRUE(has(p.stream_code, "def epi_step(accs, seeds, extras, offsets, extents):"));
  EXPECT_TRUE(has(p.stream_code, "def epi_final(accs, extras, offsets, extents, row_shape):"));
  EXPECT_TRUE(has(p.stream_code, "jnp.exp(")) << p.stream_code;
}

TEST(BlockProgram, SeveralOutputsAndOperandLayouts) {
  auto g = load("residual_per_row_scalar");
  auto req = matmul_request(*g.view, 1);
  mx::block_program p;
  std::string why;
  ASSERT_TRUE(mx::build_block_program(*g.view, req, p, why)) << why;
  ASSERT_EQ(p.operands.size(), 3u);
  std::map<int, mx::block_operand> by_input;
  for (auto& o : p.operands)
    by_input[o.input] = o;
  EXPECT_EQ(by_input[3].present, (std::vector<bool>{true, false}));  // per-row scale
  EXPECT_EQ(by_input[2].present, (std::vector<bool>{true, true}));   // residual
  EXPECT_TRUE(by_input[4].scalar);
  EXPECT_EQ(by_input[4].space_shape, "(1,)");
  ASSERT_EQ(p.outputs.size(), 2u);
  EXPECT_EQ(p.outputs[1].present, (std::vector<bool>{true, false}));
  // The first output spans the row: not streamable; the row max alone would be.
  EXPECT_FALSE(p.streamable);
  req.outputs = {g.view->output(1)};
  ASSERT_TRUE(mx::build_block_program(*g.view, req, p, why)) << why;
  EXPECT_TRUE(p.streamable) << p.stream_refusal;
  EXPECT_EQ(p.accumulators, 1);
  EXPECT_EQ(p.accumulator_dtypes, (std::vector<std::string>{"float32"}));
}

TEST(BlockProgram, GroupedSumsRefineTheFactorAndRunOnTheMxu) {
  // (x @ w).reshape(m, 4, n // 4): minus the mean of each group of n // 4 columns.
  auto g = load("groupnorm_after_matmul");
  mx::block_program p;
  std::string why;
  ASSERT_TRUE(mx::build_block_program(*g.view, matmul_request(*g.view, 1), p, why)) << why;
  // group sums and their broadcast back: one-hot matmuls over (columns, 4 groups)
  EXPECT_TRUE(has(p.code, "Precision.HIGHEST")) << p.code;
  EXPECT_TRUE(has(p.code, ", 4)")) << p.code;
  // the mean's divisor: the group size at run time, not the traced 512
  EXPECT_TRUE(has(p.code, "(_blk[1] // 4)")) << p.code;
  EXPECT_FALSE(has(p.code, "512")) << p.code;
  EXPECT_EQ(p.reduced, (std::vector<bool>{false, true}));  // blocks hold whole groups
  EXPECT_FALSE(p.streamable);
  // the output's shape: the refined factors multiply back to N
  EXPECT_EQ(p.outputs[0].ref_shape, "(x.shape[0], 4 * (w.shape[1] // 4))");
}

TEST(BlockProgram, AValueComputedTwiceIsComputedOnce) {
  // (g - mean) / sqrt(var + eps): var recomputes the mean (a second group sum) and g - mean
  // appears twice (a second expansion and subtraction); each is computed once.
  auto g = load("groupnorm_var_after_matmul");
  mx::block_program p;
  std::string why;
  ASSERT_TRUE(mx::build_block_program(*g.view, matmul_request(*g.view, 1), p, why)) << why;
  size_t dots = 0;
  for (size_t at = p.code.find("Precision.HIGHEST"); at != std::string::npos;
       at = p.code.find("Precision.HIGHEST", at + 1))
    ++dots;
  // two group sums (mean, variance), two expansions (mean, deviation)
  EXPECT_EQ(dots, 4u) << p.code;
}

TEST(BlockProgram, MaxoutPoolsGroupsOfAdjacentColumns) {
  // y.reshape(m, n // 4, 4).max(-1): the group SIZE 4 is the constant (the smaller part)
  auto g = load("maxout_after_matmul");
  mx::block_program p;
  std::string why;
  ASSERT_TRUE(mx::build_block_program(*g.view, matmul_request(*g.view, 1), p, why)) << why;
  EXPECT_EQ(p.pool_axis, 1);
  EXPECT_EQ(p.pool, 4);
  // the max of 4 lane slices of a member-major block, their width from the block at run time
  EXPECT_TRUE(has(p.code, "jnp.maximum(")) << p.code;
  EXPECT_TRUE(has(p.code, "jax.lax.slice_in_dim(s0, 3 * (_blk[1] // 4), 4 * (_blk[1] // 4), "
                          "axis=1)")) << p.code;
  EXPECT_FALSE(has(p.code, "512")) << p.code;
  EXPECT_FALSE(has(p.code, "Precision.HIGHEST")) << p.code;  // no one-hot matmuls
  EXPECT_EQ(p.reduced, (std::vector<bool>{false, false}));
  EXPECT_FALSE(p.streamable);
  ASSERT_EQ(p.outputs.size(), 1u);
  EXPECT_TRUE(p.outputs[0].pooled);
  EXPECT_EQ(p.outputs[0].ref_shape, "(x.shape[0], (w.shape[1] // 4))");
}

TEST(BlockProgram, GateSlicesOfMemberOuterColumnsArePooledLaneSlices) {
  // einsum("mk,kgn->mgn") then g[:, 1] * c + ...: the 4 gates are the members of N, listed
  // before the columns in the reference's layout (member-outer); c holds one value per column.
  auto g = load("gates_after_matmul");
  int dot = g.view->find("dot_general").at(0);
  mx::block_request r;
  r.space = {axis({512}, {"x.shape[0]"}), axis({512, 4}, {"w.shape[2]", "4"})};
  mx::block_seed s;
  s.value = node_ref(dot);
  s.dims = {{0, 0, 1}, {1, 1, 2}, {1, 0, 1}};
  r.seeds = {s};
  r.outputs = {g.view->output(0)};
  r.name = "epi";
  mx::block_program p;
  std::string why;
  // the members before the columns: refused unless the request says member-outer
  EXPECT_FALSE(mx::build_block_program(*g.view, r, p, why));
  r.member_outer = true;
  ASSERT_TRUE(mx::build_block_program(*g.view, r, p, why)) << why;
  EXPECT_EQ(p.pool_axis, 1);
  EXPECT_EQ(p.pool, 4);
  // gate 1 is lane slice 1 of the member-major block, its width from the block at run time
  EXPECT_TRUE(has(p.code, "jax.lax.slice_in_dim(s0, 1 * (_blk[1] // 4), 2 * (_blk[1] // 4), "
                          "axis=1)")) << p.code;
  EXPECT_FALSE(has(p.code, "512")) << p.code;
  ASSERT_EQ(p.operands.size(), 1u);
  EXPECT_TRUE(p.operands[0].pooled);
  EXPECT_EQ(p.operands[0].space_shape, "(x.shape[0], (w.shape[2]))");
  ASSERT_EQ(p.outputs.size(), 1u);
  EXPECT_TRUE(p.outputs[0].pooled);
  EXPECT_EQ(p.outputs[0].ref_shape, "(x.shape[0], w.shape[2])");
}

TEST(BlockProgram, RefusesUnknownPrimitives) {
  {
    auto g = load("cumsum_after_matmul");
    mx::block_program p;
    std::string why;
    EXPECT_FALSE(mx::build_block_program(*g.view, matmul_request(*g.view), p, why));
    EXPECT_TRUE(has(why, "cumsum")) << why;
  }
}

TEST(BlockProgram, Deterministic) {
  auto g = load("cross_entropy");
  mx::block_program a, b;
  std::string why;
  ASSERT_TRUE(mx::build_block_program(*g.view, matmul_request(*g.view, 1), a, why));
  ASSERT_TRUE(mx::build_block_program(*g.view, matmul_request(*g.view, 1), b, why));
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.stream_code, b.stream_code);
}
