// The profiler on profiles the TPU performance model wrote (tpu_nodes/model, linked by this
// test only: agents/ itself never includes tpu_nodes/): the copies the model counts and the
// axes the profiler reads them along must agree.
#include "agents/diagnosis.hpp"
#include "config/chip_loader.hpp"
#include "tests/agents/profile_request.hpp"
#include "tpu_nodes/model/tpu_model.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace maxkernel;
using schema::OperandRole;
using schema::SuggestionKind;

namespace {

struct modeled {
  capnp::MallocMessageBuilder request_msg, out_msg;
  schema::Diagnosis::Reader diagnosis;
  schema::Profile::Reader profile;
};

void price_and_diagnose(modeled& m, const tests::call_spec& call, const config::chip& chip) {
  auto req = m.request_msg.initRoot<schema::ProfilerRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.setChip(chip.name);
  req.setHasStructure(true);
  auto ks = req.initStructure();
  ks.setSchemaVersion(schema::SCHEMA_VERSION);
  tests::build_call(ks.initPallasCalls(1)[0], call);
  tpu_nodes::model::price_kernel(ks.asReader(), chip, req.initProfile());
  agents::diagnose(req.asReader(), chip, m.out_msg.initRoot<schema::Diagnosis>());
  m.diagnosis = m.out_msg.getRoot<schema::Diagnosis>().asReader();
  m.profile = req.asReader().getProfile();
}

config::chip chip_named(const std::string& name) {
  config::chip c;
  config::spec_error err;
  EXPECT_TRUE(config::load_chip(name, c, err)) << err.what();
  return c;
}

// x(i,k) @ y(k,j) on the grid (i, j, k) = (4, 8, 4): each step copies 1.5 MiB for
// 67 MFLOP, far more time in copies than on the MXU or in step overhead.
tests::call_spec small_block_matmul() {
  tests::call_spec c;
  c.name = "matmul";
  c.grid = {4, 8, 4};
  c.semantics = {"parallel", "parallel", "arbitrary"};
  c.operands = {
      {OperandRole::INPUT, {512, 8192}, {128, 2048}, "float32", {{0}, {2}}},
      {OperandRole::INPUT, {8192, 1024}, {2048, 128}, "bfloat16", {{2}, {1}}},
      {OperandRole::OUTPUT, {512, 1024}, {128, 128}, "float32", {{0}, {1}}},
  };
  c.dots = {{128, 128, 2048}};
  return c;
}

TEST(ModeledDiagnosis, ReReadInputOfAModeledMatmulGrowsAlongItsReReadAxis) {
  modeled m;
  price_and_diagnose(m, small_block_matmul(), chip_named("v5e"));
  ASSERT_EQ(m.profile.getCalls().size(), 1u);
  auto c0 = m.profile.getCalls()[0];
  ASSERT_EQ(std::string(c0.getBound().cStr()), "memory")
      << "compute " << c0.getComputeUs() << " dma " << c0.getDmaUs() << " overhead "
      << c0.getOverheadUs() << " steps " << c0.getSteps();
  EXPECT_EQ(m.diagnosis.getBottleneckOperand().getRole(), "input");
  EXPECT_EQ(m.diagnosis.getBottleneckOperand().getIndex(), 0);
  bool grown = false;
  for (auto s : m.diagnosis.getSuggestions())
    if (s.getKind() == SuggestionKind::GROW_BLOCK) {
      grown = true;
      EXPECT_EQ(s.getOperandIndex(), 0);
      EXPECT_EQ(s.getAxis(), 1);
      EXPECT_GE(s.getFactor(), 2);
      EXPECT_LE(s.getFactor(), 8);
      EXPECT_NE(std::string(s.getRationale().cStr()).find("re-read along grid axis 1"),
                std::string::npos)
          << s.getRationale().cStr();
    }
  EXPECT_TRUE(grown);
  EXPECT_GT(m.diagnosis.getHeadroomUs(), 0);
  EXPECT_LT(m.diagnosis.getHeadroom(), 1);
}

TEST(ModeledDiagnosis, MegacoreChipWithoutAParallelAxisSplitsTheOutputAxis) {
  auto call = small_block_matmul();
  call.semantics = {"arbitrary", "arbitrary", "arbitrary"};
  modeled m;
  price_and_diagnose(m, call, chip_named("v5p"));
  ASSERT_EQ(m.profile.getCalls()[0].getCoresUsed(), 1u);
  bool split = false;
  for (auto s : m.diagnosis.getSuggestions())
    if (s.getKind() == SuggestionKind::PARALLEL_SEMANTICS) {
      split = true;
      EXPECT_EQ(s.getAxis(), 0);
    }
  EXPECT_TRUE(split);

  // With axis 0 parallel the model splits it and the profiler has nothing to split.
  modeled p;
  price_and_diagnose(p, small_block_matmul(), chip_named("v5p"));
  EXPECT_EQ(p.profile.getCalls()[0].getCoresUsed(), 2u);
  for (auto s : p.diagnosis.getSuggestions())
    EXPECT_NE(s.getKind(), SuggestionKind::PARALLEL_SEMANTICS);
}

}  // namespace
