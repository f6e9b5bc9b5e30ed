// The XLA model on hand-computed graphs: which ops fuse and what crosses HBM.
#include "structure_builder.hpp"
#include "tpu_nodes/model/tpu_model.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

namespace maxkernel::tests {
namespace {

struct priced_graph {
  capnp::MallocMessageBuilder graph_msg;
  capnp::MallocMessageBuilder profile_msg;
  schema::Profile::Reader profile;
  double time_us = 0;
};

void price(priced_graph& out, const std::vector<node_spec>& nodes, double min_bytes = 0,
           const config::chip& chip = paper_chip()) {
  auto g = out.graph_msg.initRoot<schema::DataflowGraph>();
  build_graph(g, nodes, min_bytes);
  auto p = out.profile_msg.initRoot<schema::Profile>();
  out.time_us = tpu_nodes::model::price_xla(g.asReader(), chip, p).time_us;
  out.profile = p.asReader();
}

const std::vector<int64_t> mat{1024, 1024};  // 4 MiB of f32
const std::vector<int64_t> row{1024};        // 4 KiB
constexpr double mat_bytes = 1024.0 * 1024 * 4;
constexpr double row_bytes = 1024.0 * 4;

TEST(XlaModel, ElementwiseProducersFuseIntoTheirReduce) {
  priced_graph p;
  price(p, {{.primitive = "exp", .operand_ids = {-1}, .operand_shapes = {mat},
             .result_shape = mat},
            {.primitive = "reduce_sum", .operand_ids = {0}, .operand_shapes = {mat},
             .result_shape = row, .flops = 1 << 20}});
  EXPECT_DOUBLE_EQ(p.profile.getHbmBytes(), mat_bytes + row_bytes);
  EXPECT_NE(std::string(p.profile.getNotes()[0].cStr()).find("1 fusions"), std::string::npos);
}

TEST(XlaModel, AnElementwiseValueReadByTwoFusionsIsRecomputedInEach) {
  priced_graph p;
  price(p, {{.primitive = "exp", .operand_ids = {-1}, .operand_shapes = {mat},
             .result_shape = mat},
            {.primitive = "reduce_sum", .operand_ids = {0}, .operand_shapes = {mat},
             .result_shape = row},
            {.primitive = "reduce_max", .operand_ids = {0}, .operand_shapes = {mat},
             .result_shape = row}});
  // exp never lands in HBM: each reduce reads x and recomputes it, as XLA duplicates cheap
  // producers into their consumers.
  EXPECT_DOUBLE_EQ(p.profile.getHbmBytes(), 2 * (mat_bytes + row_bytes));
}

TEST(XlaModel, AReduceResultReadBackMakesARoundTrip) {
  priced_graph p;
  // softmax's normaliser: x / sum(x) reads x twice and the row sums once.
  price(p, {{.primitive = "reduce_sum", .operand_ids = {-1}, .operand_shapes = {mat},
             .result_shape = row, .flops = 1 << 20},
            {.primitive = "broadcast_in_dim", .operand_ids = {0}, .operand_shapes = {row},
             .result_shape = mat},
            {.primitive = "div", .operand_ids = {-1, 1}, .operand_shapes = {mat, mat},
             .result_shape = mat, .flops = 1 << 20}});
  EXPECT_DOUBLE_EQ(p.profile.getHbmBytes(), (mat_bytes + row_bytes) + (mat_bytes + row_bytes
                                                                       + mat_bytes));
}

TEST(XlaModel, EpilogueFusesIntoTheDot) {
  std::vector<int64_t> w{1024, 1024};
  priced_graph p;
  price(p, {{.primitive = "dot_general", .operand_ids = {-1, -1}, .operand_shapes = {mat, w},
             .result_shape = mat, .flops = 2.0 * 1024 * 1024 * 1024, .dot = true},
            {.primitive = "add", .operand_ids = {0, -1}, .operand_shapes = {mat, mat},
             .result_shape = mat, .flops = 1 << 20},
            {.primitive = "tanh", .operand_ids = {1}, .operand_shapes = {mat},
             .result_shape = mat, .transcendentals = 1 << 20}});
  // x, w, the bias and the result: one fusion, no intermediate in HBM.
  EXPECT_DOUBLE_EQ(p.profile.getHbmBytes(), 4 * mat_bytes);
  // f32 dot: three bf16 passes at 1e12 FLOP/s, MXU-aligned.
  double dot_us = 2.0 * 1024 * 1024 * 1024 * 3 / 1e12 * 1e6;
  double eup_us = (1 << 20) / 1e8 * 1e6;
  EXPECT_NEAR(p.profile.getComputeUs(), std::max(dot_us, eup_us), 1e-6);
}

TEST(XlaModel, ReshapesAndBroadcastsAreFree) {
  std::vector<int64_t> flat{1024 * 1024};
  priced_graph with, without;
  price(with, {{.primitive = "reshape", .operand_ids = {-1}, .operand_shapes = {flat},
                .result_shape = mat},
               {.primitive = "neg", .operand_ids = {0}, .operand_shapes = {mat},
                .result_shape = mat, .flops = 1 << 20}});
  price(without, {{.primitive = "neg", .operand_ids = {-1}, .operand_shapes = {mat},
                   .result_shape = mat, .flops = 1 << 20}});
  EXPECT_DOUBLE_EQ(with.profile.getHbmBytes(), without.profile.getHbmBytes());
  EXPECT_DOUBLE_EQ(with.time_us, without.time_us);
}

TEST(XlaModel, GatherReadsOnlyItsRows) {
  std::vector<int64_t> table{65536, 1024};
  std::vector<int64_t> idx{1024};
  priced_graph p;
  price(p, {{.primitive = "gather", .operand_ids = {-1, -1}, .operand_shapes = {table, idx},
             .result_shape = mat}});
  // rows gathered (4 MiB) + the indices (f32-sized here) + the result.
  EXPECT_DOUBLE_EQ(p.profile.getHbmBytes(), mat_bytes + row_bytes + mat_bytes);
}

TEST(XlaModel, FusionLaunchesCost) {
  auto chip = paper_chip();
  chip.efficiency.xla_fusion_us = 3;
  priced_graph p;
  price(p, {{.primitive = "neg", .operand_ids = {-1}, .operand_shapes = {row},
             .result_shape = row, .flops = 1024}},
        0, chip);
  EXPECT_NEAR(p.time_us, 3 + 2 * row_bytes * 1e-3, 1e-9);
  EXPECT_NEAR(p.profile.getOverheadUs(), 3, 1e-12);
}

TEST(XlaModel, UnknownPrimitivesAreNamedNotHidden) {
  priced_graph p;
  price(p, {{.primitive = "frobnicate", .operand_ids = {-1}, .operand_shapes = {row},
             .result_shape = row}});
  ASSERT_EQ(p.profile.getUnmodeled().size(), 1u);
  EXPECT_NE(std::string(p.profile.getUnmodeled()[0].cStr()).find("frobnicate"),
            std::string::npos);
}

TEST(XlaModel, RooflineIsTheBoundOfComputeAndCompulsoryTraffic) {
  priced_graph p;
  price(p, {{.primitive = "neg", .operand_ids = {-1}, .operand_shapes = {mat},
             .result_shape = mat, .flops = 1 << 20}},
        2 * mat_bytes);
  // 8 MiB compulsory at 1e9 B/s against 1M flops at 1e9 flop/s.
  EXPECT_NEAR(p.profile.getRooflineUs(), 2 * mat_bytes * 1e-3, 1e-6);
  EXPECT_LE(p.profile.getRooflineUs(), p.time_us + 1e-9);
}

}  // namespace
}  // namespace maxkernel::tests
