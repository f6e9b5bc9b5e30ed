// The pipeline model on hand-computed cases. On the paper chip one byte of HBM traffic and one
// VPU flop each take 1 ns, so expected times follow from the block sizes by hand.
#include "structure_builder.hpp"
#include "tpu_nodes/model/tpu_model.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <string>

namespace maxkernel::tests {
namespace {

using schema::OperandRole;

struct priced {
  capnp::MallocMessageBuilder structure_msg;
  capnp::MallocMessageBuilder profile_msg;
  tpu_nodes::model::model_result result;
  schema::Profile::Reader profile;
};

// Prices one pallas_call (plus an optional outside graph) on chip.
void price(priced& out, const call_spec& spec, const config::chip& chip,
           const std::vector<node_spec>& outside = {}) {
  auto s = out.structure_msg.initRoot<schema::KernelStructure>();
  build_call(s.initPallasCalls(1)[0], spec);
  build_graph(s.initOutside(), outside);
  auto p = out.profile_msg.initRoot<schema::Profile>();
  out.result = tpu_nodes::model::price_kernel(s.asReader(), chip, p);
  out.profile = p.asReader();
}

operand_spec tile_operand(OperandRole role, std::vector<dependence_spec> deps) {
  return {.role = role, .shape = {32, 128}, .block = {8, 128}, .deps = std::move(deps)};
}

// Grid (4,), one (8,128) f32 block (4096 B) in and out per step: every step copies 8192 B.
call_spec elementwise_call(double vpu_flops) {
  call_spec c;
  c.grid = {4};
  c.semantics = {"parallel"};
  c.operands = {tile_operand(OperandRole::INPUT, {{0}}), tile_operand(OperandRole::OUTPUT, {{0}})};
  c.vpu_flops = vpu_flops;
  return c;
}

TEST(PallasCallModel, MemoryBoundPipeline) {
  priced p;
  price(p, elementwise_call(1024), paper_chip());
  // prologue 4.096 (input) + step 0 1.024 + 3 steps x max(1.024, 8.192) + epilogue 4.096
  EXPECT_NEAR(p.profile.getTimeUs(), 4.096 + 1.024 + 3 * 8.192 + 4.096, 1e-9);
  EXPECT_NEAR(p.profile.getComputeUs(), 4 * 1.024, 1e-9);
  EXPECT_EQ(p.profile.getBound(), "memory");
  EXPECT_EQ(p.profile.getTiming(), schema::Timing::MODELED);
  EXPECT_NEAR(p.profile.getHbmBytes(), 8 * 4096.0, 1e-9);
}

TEST(PallasCallModel, ComputeBoundPipelineHidesCopies) {
  priced p;
  price(p, elementwise_call(16384), paper_chip());
  // Copies of 8.192 us hide behind steps of 16.384 us; only prologue and epilogue show.
  EXPECT_NEAR(p.profile.getTimeUs(), 4.096 + 4 * 16.384 + 4.096, 1e-9);
  EXPECT_NEAR(p.profile.getExposedDmaUs(), 2 * 4.096, 1e-9);
  EXPECT_EQ(p.profile.getBound(), "compute");
}

TEST(PallasCallModel, CopiesLongerThanComputeMakeItMemoryBound) {
  priced p;
  // 6 us of compute per step against 8.192 us of copies: most of the compute hides the copies'
  // start, but the copies set the pace.
  price(p, elementwise_call(6000), paper_chip());
  EXPECT_NEAR(p.profile.getTimeUs(), 4.096 + 6 + 3 * 8.192 + 4.096, 1e-9);
  EXPECT_EQ(p.profile.getBound(), "memory");
}

TEST(PallasCallModel, FixedCostsAddPerStepAndPerCall) {
  auto chip = paper_chip();
  chip.efficiency.step_overhead_us = 0.5;
  chip.efficiency.kernel_launch_us = 2;
  chip.efficiency.dma_latency_us = 1;
  priced p;
  price(p, elementwise_call(16384), chip);
  double step = 16.384 + 0.5;
  // launch + (latency + prologue) + 4 steps (copies of 1 + 8.192 us still hidden) + epilogue
  EXPECT_NEAR(p.profile.getTimeUs(), 2 + (1 + 4.096) + 4 * step + (1 + 4.096), 1e-9);
  EXPECT_NEAR(p.profile.getOverheadUs(), 2 + 4 * 0.5, 1e-9);
}

TEST(PallasCallModel, BlockReusedAcrossStepsIsNotCopiedAgain) {
  call_spec c;
  c.grid = {2, 4};
  c.semantics = {"parallel", "arbitrary"};
  c.operands = {tile_operand(OperandRole::INPUT, {{0}}),      // changes with the slow axis
                tile_operand(OperandRole::INPUT, {{1}}),      // changes with the fast axis
                tile_operand(OperandRole::INPUT, {}),         // never changes
                tile_operand(OperandRole::OUTPUT, {{0}})};
  c.vpu_flops = 1;
  priced p;
  price(p, c, paper_chip());
  auto traffic = p.profile.getCalls()[0].getTraffic();
  ASSERT_EQ(traffic.size(), 4u);
  EXPECT_DOUBLE_EQ(traffic[0].getCopies(), 2);  // once per row of the grid
  EXPECT_DOUBLE_EQ(traffic[1].getCopies(), 8);  // every step (wraps when the row advances)
  EXPECT_DOUBLE_EQ(traffic[2].getCopies(), 1);
  EXPECT_DOUBLE_EQ(traffic[3].getCopies(), 2);  // written back when its row is done
  EXPECT_DOUBLE_EQ(traffic[1].getBytes(), 8 * 4096.0);
}

TEST(PallasCallModel, PartialChangeFractionScalesCopies) {
  call_spec c;
  c.grid = {8};
  c.semantics = {"arbitrary"};
  c.operands = {tile_operand(OperandRole::INPUT, {{0, schema::DepKind::IRREGULAR, 0.5}}),
                tile_operand(OperandRole::OUTPUT, {})};
  priced p;
  price(p, c, paper_chip());
  EXPECT_DOUBLE_EQ(p.profile.getCalls()[0].getTraffic()[0].getCopies(), 1 + 7 * 0.5);
}

call_spec dot_call(std::vector<std::string> semantics, int64_t m, int64_t n, int64_t k,
                   std::string dtype = "bfloat16") {
  call_spec c;
  c.grid = {4};
  c.semantics = std::move(semantics);
  // Tiny operands that never change: the call is all MXU work.
  c.operands = {{.role = OperandRole::INPUT, .shape = {8, 128}, .block = {8, 128}},
                {.role = OperandRole::OUTPUT, .shape = {8, 128}, .block = {8, 128}}};
  c.dots = {{m, n, k, dtype}};
  return c;
}

double step_us(const priced& p) {
  auto call = p.profile.getCalls()[0];
  return call.getComputeUs() / call.getSteps();
}

TEST(PallasCallModel, MegacoreSplitsParallelAxes) {
  auto chip = paper_chip();
  chip.cores_per_device = 2;
  chip.megacore = true;
  chip.bf16_flops = 2e12;  // 1e12 per core
  priced parallel, serial;
  price(parallel, dot_call({"parallel"}, 128, 128, 128), chip);
  price(serial, dot_call({"arbitrary"}, 128, 128, 128), chip);
  auto pc = parallel.profile.getCalls()[0];
  auto sc = serial.profile.getCalls()[0];
  EXPECT_EQ(pc.getCoresUsed(), 2u);
  EXPECT_DOUBLE_EQ(pc.getSteps(), 2);
  EXPECT_EQ(sc.getCoresUsed(), 1u);
  EXPECT_DOUBLE_EQ(sc.getSteps(), 4);
  double step = 2.0 * 128 * 128 * 128 / 1e12 * 1e6;
  EXPECT_NEAR(pc.getComputeUs(), 2 * step, 1e-9);
  EXPECT_NEAR(sc.getComputeUs(), 4 * step, 1e-9);
  bool idle_note = false;
  for (auto n : serial.profile.getNotes())
    idle_note = idle_note || std::string(n.cStr()).find("idles") != std::string::npos;
  EXPECT_TRUE(idle_note);
}

TEST(PallasCallModel, MxuPadsToItsEdge) {
  priced aligned, small, over;
  price(aligned, dot_call({"arbitrary"}, 128, 128, 128), paper_chip());
  price(small, dot_call({"arbitrary"}, 100, 100, 100), paper_chip());
  price(over, dot_call({"arbitrary"}, 128, 129, 128), paper_chip());
  double full = 2.0 * 128 * 128 * 128 / 1e12 * 1e6;
  EXPECT_NEAR(step_us(aligned), full, 1e-9);
  // m pads to 8 sublanes (104), n and k to the 128-wide MXU.
  EXPECT_NEAR(step_us(small), full * 104 / 128, 1e-9);
  EXPECT_NEAR(step_us(over), full * 2, 1e-9);
  EXPECT_LT(small.profile.getCalls()[0].getMxuUtilization(),
            aligned.profile.getCalls()[0].getMxuUtilization());
}

TEST(PallasCallModel, MatmulRateFollowsOperandTypes) {
  priced bf16, f32, int8;
  price(bf16, dot_call({"arbitrary"}, 128, 128, 128, "bfloat16"), paper_chip());
  price(f32, dot_call({"arbitrary"}, 128, 128, 128, "float32"), paper_chip());
  price(int8, dot_call({"arbitrary"}, 128, 128, 128, "int8"), paper_chip());
  EXPECT_NEAR(step_us(f32), 3 * step_us(bf16), 1e-9);   // three bf16 passes
  EXPECT_NEAR(step_us(int8), step_us(bf16) / 2, 1e-9);  // paper chip: int8 at twice bf16
  auto no_int8 = paper_chip();
  no_int8.int8_ops = 0;
  priced emulated;
  price(emulated, dot_call({"arbitrary"}, 128, 128, 128, "int8"), no_int8);
  EXPECT_NEAR(step_us(emulated), step_us(bf16), 1e-9);
}

TEST(PallasCallModel, VmemOverTheScopedLimitDoesNotCompile) {
  call_spec c;
  c.grid = {4};
  c.semantics = {"parallel"};
  // (2048, 1024) f32 blocks are 8 MiB; in and out, double-buffered: 32 MiB > 16 MiB.
  c.operands = {{.role = OperandRole::INPUT, .shape = {8192, 1024}, .block = {2048, 1024},
                 .deps = {{0}}},
                {.role = OperandRole::OUTPUT, .shape = {8192, 1024}, .block = {2048, 1024},
                 .deps = {{0}}}};
  priced refused;
  price(refused, c, paper_chip());
  EXPECT_FALSE(refused.result.compiles);
  EXPECT_NE(refused.result.compile_error.find("VMEM OOM: needs 32.00 MiB, limit 16.00 MiB"),
            std::string::npos)
      << refused.result.compile_error;
  EXPECT_EQ(refused.profile.getVmemPeakBytes(), 32 << 20);

  c.vmem_limit = 64 << 20;
  priced raised;
  price(raised, c, paper_chip());
  EXPECT_TRUE(raised.result.compiles) << raised.result.compile_error;

  c.vmem_limit = 256ll << 20;  // beyond the 128 MiB the core has
  priced impossible;
  price(impossible, c, paper_chip());
  EXPECT_FALSE(impossible.result.compiles);
}

TEST(PallasCallModel, ScratchAndTilePaddingCountInVmem) {
  call_spec c;
  c.grid = {1};
  c.semantics = {"arbitrary"};
  // A (1, 100) f32 block occupies a whole (8, 128) tile: 4096 B, twice.
  c.operands = {{.role = OperandRole::INPUT, .shape = {1, 100}, .block = {1, 100}}};
  c.scratch = {{{16, 256}, "float32"}};
  priced p;
  price(p, c, paper_chip());
  EXPECT_EQ(p.profile.getVmemPeakBytes(), 2 * 4096 + 16 * 256 * 4);
}

TEST(PallasCallModel, ManualDmaIsPricedPerStep) {
  auto c = elementwise_call(16384);
  c.operands.push_back({.role = OperandRole::INPUT, .shape = {1 << 20}, .block = {1 << 20},
                        .space = "any"});
  priced without, with;
  price(without, elementwise_call(16384), paper_chip());
  c.dma_bytes = 32768;  // 32.768 us per step: longer than the step's compute
  price(with, c, paper_chip());
  EXPECT_GT(with.profile.getTimeUs(), without.profile.getTimeUs() + 3 * (32.768 - 16.384));
  EXPECT_EQ(with.profile.getBound(), "memory");
}

TEST(PallasCallModel, WorkOutsideTheKernelIsPriced) {
  std::vector<int64_t> big{1024, 1024};
  std::vector<node_spec> outside{
      {.primitive = "exp", .operand_ids = {-1}, .operand_shapes = {big}, .result_shape = big,
       .transcendentals = 1 << 20},
      {.primitive = "pallas_call", .operand_ids = {0}, .operand_shapes = {big},
       .result_shape = big}};
  priced alone, with_outside;
  price(alone, elementwise_call(1024), paper_chip());
  price(with_outside, elementwise_call(1024), paper_chip(), outside);
  // exp of 1M elements: 4 MiB in and out (8388.608 us) against 1M transcendentals at 1e8/s.
  double exp_us = std::max(8.0 * (1 << 20) * 1e-3, (1 << 20) / 1e8 * 1e6);
  EXPECT_NEAR(with_outside.profile.getOutsideUs(), exp_us, 1e-6);
  EXPECT_NEAR(with_outside.profile.getTimeUs(), alone.profile.getTimeUs() + exp_us, 1e-6);
}

TEST(PallasCallModel, UnknownBodyPrimitivesAreReported) {
  capnp::MallocMessageBuilder msg, prof;
  auto s = msg.initRoot<schema::KernelStructure>();
  auto call = s.initPallasCalls(1)[0];
  build_call(call, elementwise_call(1024));
  call.initUnknownPrimitives(1).set(0, "mystery_op");
  build_graph(s.initOutside(), {});
  auto p = prof.initRoot<schema::Profile>();
  tpu_nodes::model::price_kernel(s.asReader(), paper_chip(), p);
  ASSERT_EQ(p.asReader().getUnmodeled().size(), 1u);
  EXPECT_NE(std::string(p.asReader().getUnmodeled()[0].cStr()).find("mystery_op"),
            std::string::npos);
}

}  // namespace
}  // namespace maxkernel::tests
