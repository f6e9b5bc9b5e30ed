// A kernel's fingerprint: equal structures give one, however their messages are laid out;
// anything the lowering changes but the VMEM limit gives another.
#include "search/kernel_fingerprint.hpp"

#include <capnp/message.h>
#include <gtest/gtest.h>

namespace maxkernel::search {
namespace {

void fill(schema::KernelStructure::Builder s, int64_t vmem_limit, int64_t block_rows) {
  s.setSchemaVersion(1);
  auto call = s.initPallasCalls(1)[0];
  call.setName("kernel");
  auto grid = call.initGrid(2);
  grid.set(0, 4);
  grid.set(1, 8);
  call.setVmemLimitBytes(vmem_limit);
  auto op = call.initOperands(1)[0];
  auto block = op.initBlockShape(2);
  block.set(0, block_rows);
  block.set(1, 128);
  auto dot = call.initStepDots(1)[0];
  dot.setM(block_rows);
  dot.setN(128);
  dot.setK(256);
  dot.setLhsDtype("bfloat16");
}

std::string fingerprint_of(int64_t vmem_limit, int64_t block_rows) {
  capnp::MallocMessageBuilder msg;
  auto s = msg.initRoot<schema::KernelStructure>();
  fill(s, vmem_limit, block_rows);
  return kernel_fingerprint(s.asReader());
}

TEST(KernelFingerprint, EqualStructuresGiveOneFingerprint) {
  auto a = fingerprint_of(1 << 25, 512);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(fingerprint_of(1 << 25, 512), a);
  // The same structure in a message of another layout: tiny segments, and a field set
  // twice (its first list left behind as garbage in the message).
  capnp::MallocMessageBuilder scattered(1, capnp::AllocationStrategy::FIXED_SIZE);
  auto s = scattered.initRoot<schema::KernelStructure>();
  s.initPallasCalls(3);
  fill(s, 1 << 25, 512);
  EXPECT_GT(scattered.getSegmentsForOutput().size(), 1u);
  EXPECT_EQ(kernel_fingerprint(s.asReader()), a);
}

TEST(KernelFingerprint, WhatTheLoweringChangesGivesAnother) {
  auto a = fingerprint_of(1 << 25, 512);
  EXPECT_NE(fingerprint_of(1 << 25, 256), a);  // another block
  // The VMEM limit only decides whether the kernel compiles: the same kernel.
  EXPECT_EQ(fingerprint_of(1 << 26, 512), a);
  EXPECT_EQ(fingerprint_of(0, 512), a);
}

}  // namespace
}  // namespace maxkernel::search
