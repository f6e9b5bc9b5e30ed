// agents::diagnose on hand-built profiles and structures: each rule of docs/agents.md fires
// on the numbers it is about and names the call, operand, axis and factor they imply.
#include "agents/diagnosis.hpp"
#include "messages/capnp_io.hpp"
#include "tests/agents/profile_request.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <string>
#include <vector>

using namespace maxkernel;
using schema::DepKind;
using schema::OperandRole;
using schema::SuggestionKind;
using tests::call_profile_spec;
using tests::call_spec;
using tests::profile_spec;

namespace {

constexpr double mib = 1024.0 * 1024.0;

struct diagnosis {
  capnp::MallocMessageBuilder request_msg, out_msg;
  schema::Diagnosis::Reader get() { return out_msg.getRoot<schema::Diagnosis>().asReader(); }

  std::vector<schema::Suggestion::Reader> of(SuggestionKind kind) {
    std::vector<schema::Suggestion::Reader> v;
    for (auto s : get().getSuggestions())
      if (s.getKind() == kind)
        v.push_back(s);
    return v;
  }
};

void run(diagnosis& d, const profile_spec& p, const std::vector<call_spec>& s,
         const config::chip& chip) {
  auto req = d.request_msg.initRoot<schema::ProfilerRequest>();
  tests::build_request(req, p, s, chip.name);
  agents::diagnose(req.asReader(), chip, d.out_msg.initRoot<schema::Diagnosis>());
}

bool contains(capnp::Text::Reader text, const std::string& part) {
  return std::string(text.cStr()).find(part) != std::string::npos;
}

// A tiled matmul x(i,k) @ y(k,j) -> out(i,j) on the grid (i, j, k) = (4, 8, 4): x's blocks
// do not move along j, but k wraps at every j step, so x is copied again 8 times.
call_spec matmul_structure(int64_t vmem_limit = 0) {
  call_spec c;
  c.name = "matmul";
  c.grid = {4, 8, 4};
  c.semantics = {"parallel", "parallel", "arbitrary"};
  c.operands = {
      {OperandRole::INPUT, {512, 2048}, {128, 512}, "float32", {{0}, {2}}},
      {OperandRole::INPUT, {2048, 1024}, {512, 128}, "bfloat16", {{2}, {1}}},
      {OperandRole::OUTPUT, {512, 1024}, {128, 128}, "float32", {{0}, {1}}},
  };
  c.dots = {{128, 128, 512}};
  c.vmem_limit = vmem_limit;
  return c;
}

// Its profile: memory-bound, x's 16 blocks copied 128 times (32 MiB of 50 MiB).
profile_spec matmul_profile(int64_t vmem_bytes) {
  call_profile_spec c;
  c.name = "matmul";
  c.bound = "memory";
  c.time_us = 100;
  c.compute_us = 40;
  c.dma_us = 100;
  c.exposed_dma_us = 60;
  c.hbm_bytes = 50 * mib;
  c.steps = 128;
  c.vmem_bytes = vmem_bytes;
  c.traffic = {{"input", 0, 128, 32 * mib}, {"input", 1, 128, 16 * mib}, {"output", 0, 32, 2 * mib}};
  profile_spec p;
  p.bound = "memory";
  p.time_us = 100;
  p.roofline_us = 30;
  p.calls = {c};
  return p;
}

TEST(Diagnose, MemoryBoundGrowsTheBlockAlongTheAxisTheDominantOperandIsReReadOn) {
  diagnosis d;
  auto chip = tests::paper_chip();  // 16 MiB scoped VMEM, 128 MiB physical, 1e9 B/s
  chip.hbm_bandwidth = 1e12;
  run(d, matmul_profile(896 * 1024), {matmul_structure()}, chip);
  auto r = d.get();
  EXPECT_EQ(r.getBound(), "memory");
  EXPECT_EQ(r.getBottleneckCall(), 0);
  EXPECT_EQ(r.getBottleneckCallName(), "matmul");
  EXPECT_EQ(r.getBottleneckOperand().getRole(), "input");
  EXPECT_EQ(r.getBottleneckOperand().getIndex(), 0);
  EXPECT_DOUBLE_EQ(r.getHeadroom(), 0.3);
  EXPECT_DOUBLE_EQ(r.getHeadroomUs(), 70);
  EXPECT_EQ(r.getTiming(), schema::Timing::MODELED);

  auto grow = d.of(SuggestionKind::GROW_BLOCK);
  ASSERT_EQ(grow.size(), 1u);
  EXPECT_EQ(grow[0].getCallIndex(), 0);
  EXPECT_EQ(grow[0].getOperandRole(), "input");
  EXPECT_EQ(grow[0].getOperandIndex(), 0);
  EXPECT_EQ(grow[0].getAxis(), 1);  // j: x does not move along it, k wraps at each j step
  // Growing along j grows y's and out's buffers (384 KiB per doubling): plenty of room in
  // 16 MiB, so the 8 steps of j bound the factor.
  EXPECT_DOUBLE_EQ(grow[0].getFactor(), 8);
  auto why = grow[0].getRationale();
  EXPECT_TRUE(contains(why, "52% of HBM bandwidth")) << why.cStr();  // 50 MiB in 100 us of 1e12 B/s
  EXPECT_TRUE(contains(why, "input 0 is copied 128 times (32.0 MiB of 50.0 MiB traffic)"))
      << why.cStr();
  EXPECT_TRUE(contains(why, "8x per block, re-read along grid axis 1 (8 steps)")) << why.cStr();
  EXPECT_TRUE(contains(why, "VMEM 0.9 of 16.0 MiB leaves room for 8x")) << why.cStr();
  EXPECT_TRUE(d.of(SuggestionKind::RAISE_VMEM_LIMIT).empty());
}

TEST(Diagnose, GrowthIsBoundedByTheVmemLeft) {
  diagnosis d;
  // 14.5 MiB used of 16: room for 1 + 1.5 MiB / 384 KiB = 5 -> 4x.
  run(d, matmul_profile(static_cast<int64_t>(14.5 * mib)), {matmul_structure()},
      tests::paper_chip());
  auto grow = d.of(SuggestionKind::GROW_BLOCK);
  ASSERT_EQ(grow.size(), 1u);
  EXPECT_DOUBLE_EQ(grow[0].getFactor(), 4);
}

TEST(Diagnose, NearlyFullVmemRaisesTheLimitUpToThePhysicalVmemInsteadOfGrowing) {
  diagnosis d;
  run(d, matmul_profile(static_cast<int64_t>(15.8 * mib)), {matmul_structure()},
      tests::paper_chip());
  EXPECT_TRUE(d.of(SuggestionKind::GROW_BLOCK).empty());
  auto raise = d.of(SuggestionKind::RAISE_VMEM_LIMIT);
  ASSERT_EQ(raise.size(), 1u);
  EXPECT_DOUBLE_EQ(raise[0].getFactor(), 8);  // 16 MiB -> 128 MiB
  EXPECT_EQ(raise[0].getAxis(), 1);
  auto why = raise[0].getRationale();
  EXPECT_TRUE(contains(why, "VMEM 15.8 of 16.0 MiB is too full")) << why.cStr();
  EXPECT_TRUE(contains(why, "raise vmem_limit_bytes to 128.0 MiB")) << why.cStr();
}

TEST(Diagnose, FullPhysicalVmemAndARevisitedOutputLeaveNoMoveForTheReRead) {
  diagnosis d;
  // The limit is already the physical 128 MiB and nearly used; moving j innermost would
  // revisit out(i,j) along k, so neither growth, a raise nor a reorder is offered.
  run(d, matmul_profile(static_cast<int64_t>(127.9 * mib)),
      {matmul_structure(static_cast<int64_t>(128 * mib))}, tests::paper_chip());
  EXPECT_TRUE(d.of(SuggestionKind::GROW_BLOCK).empty());
  EXPECT_TRUE(d.of(SuggestionKind::RAISE_VMEM_LIMIT).empty());
  EXPECT_TRUE(d.of(SuggestionKind::REORDER_GRID).empty());
  ASSERT_EQ(d.get().getSuggestions().size(), 1u);
  EXPECT_EQ(d.get().getSuggestions()[0].getKind(), SuggestionKind::NONE);
}

TEST(Diagnose, FullVmemWithAReorderableGridMovesTheAxisInnermost) {
  diagnosis d;
  // x is re-read along j as in the matmul, but the output moves along every axis, so moving
  // j innermost revisits no output block.
  call_spec c;
  c.name = "k";
  c.grid = {4, 8, 4};
  c.operands = {
      {OperandRole::INPUT, {512, 2048}, {128, 512}, "float32", {{0}, {2}}},
      {OperandRole::OUTPUT, {512, 1024, 2048}, {128, 128, 512}, "float32", {{0}, {1}, {2}}},
  };
  c.vmem_limit = static_cast<int64_t>(128 * mib);
  auto p = matmul_profile(static_cast<int64_t>(127.9 * mib));
  p.calls[0].traffic = {{"input", 0, 128, 32 * mib}, {"output", 0, 128, 8 * mib}};
  run(d, p, {c}, tests::paper_chip());
  auto reorder = d.of(SuggestionKind::REORDER_GRID);
  ASSERT_EQ(reorder.size(), 1u);
  EXPECT_EQ(reorder[0].getAxis(), 1);
  EXPECT_EQ(reorder[0].getOperandIndex(), 0);
}

TEST(Diagnose, MegacoreChipWithAnIdleCoreMarksAnOutputAxisParallel) {
  auto chip = tests::paper_chip();
  chip.megacore = true;
  chip.cores_per_device = 2;
  // Grid (k, i): axis 0 is a reduction (the output does not move along it), so the
  // parallel axis must be 1.
  call_spec c;
  c.name = "reduce";
  c.grid = {8, 16};
  c.semantics = {"arbitrary", "arbitrary"};
  c.operands = {
      {OperandRole::INPUT, {1024, 2048}, {128, 128}, "float32", {{0}, {1}}},
      {OperandRole::OUTPUT, {2048}, {128}, "float32", {{1}}},
  };
  call_profile_spec cp;
  cp.name = "reduce";
  cp.bound = "compute";
  cp.time_us = 80;
  cp.compute_us = 80;
  cp.cores_used = 1;
  profile_spec p{"compute", 80, 40, 0, {cp}};

  diagnosis d;
  run(d, p, {c}, chip);
  auto par = d.of(SuggestionKind::PARALLEL_SEMANTICS);
  ASSERT_EQ(par.size(), 1u);
  EXPECT_EQ(par[0].getAxis(), 1);
  EXPECT_DOUBLE_EQ(par[0].getFactor(), 2);
  EXPECT_TRUE(contains(par[0].getRationale(), "runs on 1 of the device's 2 TensorCores"))
      << par[0].getRationale().cStr();

  // Both cores busy, or a chip without megacore: nothing to split.
  diagnosis both;
  p.calls[0].cores_used = 2;
  run(both, p, {c}, chip);
  EXPECT_TRUE(both.of(SuggestionKind::PARALLEL_SEMANTICS).empty());
  diagnosis single;
  p.calls[0].cores_used = 1;
  run(single, p, {c}, tests::paper_chip());
  EXPECT_TRUE(single.of(SuggestionKind::PARALLEL_SEMANTICS).empty());
}

TEST(Diagnose, OverheadBoundReducesTheStepsAlongTheLongestAxis) {
  call_spec c;
  c.name = "scale";
  c.grid = {2, 1024};
  c.operands = {
      {OperandRole::INPUT, {16, 131072}, {8, 128}, "float32", {{0}, {1}}},
      {OperandRole::OUTPUT, {16, 131072}, {8, 128}, "float32", {{0}, {1}}},
  };
  call_profile_spec cp;
  cp.name = "scale";
  cp.bound = "overhead";
  cp.time_us = 800;
  cp.overhead_us = 717;
  cp.steps = 2048;
  cp.vmem_bytes = 16 * 1024;
  profile_spec p{"overhead", 800, 20, 0, {cp}};
  diagnosis d;
  auto chip = tests::paper_chip();
  chip.scoped_vmem_bytes = 1 << 20;  // 1 MiB: 16 KiB per doubling -> room for 64x
  run(d, p, {c}, chip);
  auto r = d.of(SuggestionKind::REDUCE_STEPS);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].getAxis(), 1);
  EXPECT_DOUBLE_EQ(r[0].getFactor(), 64);
  EXPECT_TRUE(contains(r[0].getRationale(), "2048 grid steps per core, 717.0 of 800.0 us"))
      << r[0].getRationale().cStr();
  EXPECT_TRUE(d.of(SuggestionKind::GROW_BLOCK).empty());
}

TEST(Diagnose, UnalignedBlockDimsPadTheMxu) {
  call_spec c;
  c.name = "mm";
  c.grid = {4, 4};
  c.operands = {
      {OperandRole::INPUT, {512, 300}, {128, 300}, "bfloat16", {{0}}},
      {OperandRole::INPUT, {300, 800}, {300, 200}, "bfloat16", {{1}}},
      {OperandRole::OUTPUT, {512, 800}, {128, 200}, "float32", {{0}, {1}}},
  };
  c.dots = {{128, 200, 300}};
  call_profile_spec cp;
  cp.name = "mm";
  cp.bound = "compute";
  cp.time_us = 50;
  cp.compute_us = 45;
  profile_spec p{"compute", 50, 30, 0, {cp}};
  diagnosis d;
  run(d, p, {c}, tests::paper_chip());  // MXU edge 128
  auto a = d.of(SuggestionKind::ALIGN_TO_MXU);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].getOperandRole(), "input");
  // Its block tiles n = 200 of 800; k = 300 is the whole of both inputs, no block sets it.
  EXPECT_EQ(a[0].getOperandIndex(), 1);
  // 128x200x300 pads to 128x256x384: 60000 / 98304 of the work is useful.
  EXPECT_NEAR(a[0].getFactor(), 98304.0 / 60000.0, 1e-9);
  EXPECT_TRUE(contains(a[0].getRationale(), "pads to 128x256x384 on the 128-wide MXU: 39%"))
      << a[0].getRationale().cStr();

  // The same blocks aligned: no padding to remove.
  c.operands[0].block = {128, 256};
  c.operands[1].block = {256, 256};
  c.dots = {{128, 256, 256}};
  diagnosis aligned;
  run(aligned, p, {c}, tests::paper_chip());
  EXPECT_TRUE(aligned.of(SuggestionKind::ALIGN_TO_MXU).empty());
  // On a chip with a 256-wide MXU, 128-wide blocks pad again.
  auto wide = tests::paper_chip();
  wide.mxu_size = 256;
  c.dots = {{128, 128, 128}};
  diagnosis padded;
  run(padded, p, {c}, wide);
  EXPECT_EQ(padded.of(SuggestionKind::ALIGN_TO_MXU).size(), 1u);
}

TEST(Diagnose, PaddingFromTheTasksOwnDimensionIsExplainedNotSuggested) {
  // Attention's q.k^T with head_dim 128 on a 256-wide MXU: k = 128 is the whole last
  // dimension of both inputs, so no block size can align it.
  call_spec c;
  c.name = "attn";
  c.grid = {8, 8};
  c.operands = {
      {OperandRole::INPUT, {4096, 128}, {512, 128}, "bfloat16", {{0}}},
      {OperandRole::INPUT, {4096, 128}, {512, 128}, "bfloat16", {{1}}},
      {OperandRole::OUTPUT, {4096, 4096}, {512, 512}, "float32", {{0}, {1}}},
  };
  c.dots = {{512, 512, 128}};
  call_profile_spec cp;
  cp.name = "attn";
  cp.bound = "compute";
  cp.time_us = 50;
  cp.compute_us = 45;
  profile_spec p{"compute", 50, 30, 0, {cp}};
  auto wide = tests::paper_chip();
  wide.mxu_size = 256;
  diagnosis d;
  run(d, p, {c}, wide);
  EXPECT_TRUE(d.of(SuggestionKind::ALIGN_TO_MXU).empty());
  auto none = d.of(SuggestionKind::NONE);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(contains(none[0].getRationale(), "pads to 512x512x256 on the 256-wide MXU: 50%"))
      << none[0].getRationale().cStr();
  EXPECT_TRUE(contains(none[0].getRationale(), "128 is an input's whole dimension"))
      << none[0].getRationale().cStr();

  // The same dot where k = 128 is a tile of a 1024-wide dimension: a block can align it.
  c.operands[0].shape = {4096, 1024};
  diagnosis tiled;
  run(tiled, p, {c}, wide);
  auto a = tiled.of(SuggestionKind::ALIGN_TO_MXU);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].getOperandIndex(), 0);
}

TEST(Diagnose, LargeOutsideShareFusesTheOutsideWorkFirst) {
  call_profile_spec cp;
  cp.name = "kernel";
  cp.bound = "compute";
  cp.time_us = 40;
  cp.compute_us = 40;
  profile_spec p{"memory", 100, 50, 60, {cp}};
  diagnosis d;
  run(d, p, {}, tests::paper_chip());
  auto s = d.get().getSuggestions();
  ASSERT_GE(s.size(), 1u);
  EXPECT_EQ(s[0].getKind(), SuggestionKind::FUSE_OUTSIDE_WORK);
  EXPECT_EQ(s[0].getCallIndex(), -1);
  EXPECT_TRUE(contains(s[0].getRationale(), "60.0 of 100.0 us (60%) is XLA work outside"))
      << s[0].getRationale().cStr();

  p.outside_us = 5;
  p.time_us = 45;
  diagnosis small;
  run(small, p, {}, tests::paper_chip());
  EXPECT_TRUE(small.of(SuggestionKind::FUSE_OUTSIDE_WORK).empty());
}

TEST(Diagnose, ComputeBoundNearRooflineSuggestsNoGrowth) {
  call_spec c = matmul_structure();
  c.dots = {{128, 128, 512}};
  call_profile_spec cp;
  cp.name = "matmul";
  cp.bound = "compute";
  cp.time_us = 100;
  cp.compute_us = 97;
  cp.dma_us = 60;
  cp.steps = 128;
  cp.vmem_bytes = 896 * 1024;
  cp.traffic = {{"input", 0, 128, 32 * mib}, {"input", 1, 128, 16 * mib}};
  profile_spec p{"compute", 100, 95, 0, {cp}};
  diagnosis d;
  run(d, p, {c}, tests::paper_chip());
  auto r = d.get();
  EXPECT_DOUBLE_EQ(r.getHeadroom(), 0.95);
  EXPECT_DOUBLE_EQ(r.getHeadroomUs(), 5);
  EXPECT_EQ(r.getBottleneckOperand().getIndex(), -1);  // compute sets the pace
  ASSERT_EQ(r.getSuggestions().size(), 1u);
  EXPECT_EQ(r.getSuggestions()[0].getKind(), SuggestionKind::NONE);
  EXPECT_TRUE(contains(r.getSuggestions()[0].getRationale(), "compute-bound at 95% of roofline"))
      << r.getSuggestions()[0].getRationale().cStr();
}

TEST(Diagnose, FewStepsWithExposedCopiesShrinkTheBlock) {
  call_spec c;
  c.name = "copy";
  c.grid = {2};
  c.operands = {
      {OperandRole::INPUT, {2048, 1024}, {1024, 1024}, "float32", {{0}}},
      {OperandRole::OUTPUT, {2048, 1024}, {1024, 1024}, "float32", {{0}}},
  };
  call_profile_spec cp;
  cp.name = "copy";
  cp.bound = "memory";
  cp.time_us = 30;
  cp.dma_us = 30;
  cp.exposed_dma_us = 20;
  cp.steps = 2;
  cp.vmem_bytes = 16 * 1024 * 1024;
  cp.traffic = {{"input", 0, 2, 8 * mib}, {"output", 0, 2, 8 * mib}};
  profile_spec p{"memory", 30, 10, 0, {cp}};
  diagnosis d;
  run(d, p, {c}, tests::paper_chip());
  auto s = d.of(SuggestionKind::SHRINK_BLOCK);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].getFactor(), 4);  // 2 steps -> 8
  EXPECT_EQ(s[0].getAxis(), 0);
  EXPECT_TRUE(d.of(SuggestionKind::GROW_BLOCK).empty());
}

TEST(Diagnose, IsDeterministic) {
  auto chip = tests::paper_chip();
  diagnosis a, b;
  run(a, matmul_profile(896 * 1024), {matmul_structure()}, chip);
  run(b, matmul_profile(896 * 1024), {matmul_structure()}, chip);
  EXPECT_EQ(messages::encode(a.out_msg), messages::encode(b.out_msg));
}

}  // namespace

namespace {

TEST(Diagnose, NonFiniteFiguresGiveFiniteFactorsAndTerminate) {
  // A measured profile may carry anything a decoder accepts: infinite steps, NaN times.
  call_profile_spec cp;
  cp.name = "odd";
  cp.bound = "overhead";
  cp.time_us = std::numeric_limits<double>::infinity();
  cp.overhead_us = std::nan("");
  cp.steps = std::numeric_limits<double>::infinity();
  cp.vmem_bytes = 0;
  profile_spec p{"overhead", std::numeric_limits<double>::infinity(), 1, std::nan(""), {cp}};
  diagnosis d;
  run(d, p, {}, tests::paper_chip());
  ASSERT_GE(d.get().getSuggestions().size(), 1u);
  for (auto s : d.get().getSuggestions())
    EXPECT_TRUE(std::isfinite(s.getFactor())) << s.getRationale().cStr();

  cp.bound = "memory";
  cp.exposed_dma_us = 1;
  cp.steps = 1e-300;
  cp.traffic = {{"input", 0, std::numeric_limits<double>::infinity(), 1}};
  p.calls = {cp};
  diagnosis m;
  run(m, p, {}, tests::paper_chip());
  for (auto s : m.get().getSuggestions())
    EXPECT_TRUE(std::isfinite(s.getFactor())) << s.getRationale().cStr();
}

}  // namespace
