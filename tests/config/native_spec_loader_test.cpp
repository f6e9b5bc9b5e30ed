// Good native specs load into exactly the KernelSpec fields docs/spec-format.md promises.
#include "temp_spec_dir.hpp"

#include "maxkernel/schema/common.capnp.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace maxkernel::config::test {
namespace {

namespace fs = std::filesystem;
using schema::Generator;

const char* full_spec = R"(name: fused_op-v1.2
description: every feature at once
dims: {M: 64, K: 32, N: 16}
inputs:
  - name: x
    shape: [M, K]
    dtype: bfloat16
    generator: {normal: {mean: 0.5, std: 2}}
  - name: w
    shape: [K, 16]
    dtype: float32
    generator:
      uniform: {low: -1, high: 1}
  - name: ids
    shape: [M]
    dtype: int32
    generator: {randint: {low: 0, high: 16}}
    structural: true
  - name: mask
    shape: [N]
    dtype: bool
    generator: {randint: {high: 2}}
  - name: z
    shape: []
    dtype: float16
    generator: zeros
  - name: o
    shape: [4, N]
    dtype: uint8
    generator: {ones: {}}
  - name: c
    shape: [8]
    dtype: float32
    generator:
      code: |
        def generate(rng, shape, dtype, dims):
            return rng.standard_normal(shape).astype(dtype)
  - name: eps
    static: 1.0e-5
  - name: block
    static: 128
  - name: causal
    static: true
  - name: mode
    static: "fast \"one\""
  - name: d
    shape: [N]
    dtype: float8_e4m3fn
reference: |
  import jax.numpy as jnp

  def reference(x, w, ids, mask, z, o, c, eps, block, causal, mode, d):
      return jnp.dot(x, w), ids
tolerance:
  - {output: 0, atol: 1e-2, rtol: 0.02}
  - {output: 1, atol: 0, rtol: 0}
chip: v5e
baseline: kernels/base.py
)";

TEST(NativeSpecLoader, FullSpecMapsEveryField) {
  temp_spec_dir dir;
  dir.write("kernels/base.py", "def workload(x):\n    return x\n");
  auto path = dir.write("spec.yaml", full_spec);
  load_result r;
  load(path, r);
  ASSERT_TRUE(r.ok) << r.error.what();
  auto s = r.spec.asReader();
  EXPECT_EQ(s.getSchemaVersion(), schema::SCHEMA_VERSION);
  EXPECT_EQ(std::string(s.getName()), "fused_op-v1.2");
  EXPECT_EQ(std::string(s.getDescription()), "every feature at once");
  EXPECT_EQ(s.getFormat(), schema::SpecFormat::NATIVE);
  EXPECT_EQ(std::string(s.getSourcePath()), path);
  EXPECT_EQ(std::string(s.getReferenceEntry()), "reference");
  EXPECT_NE(std::string(s.getReference()).find("def reference(x, w, ids"), std::string::npos);
  EXPECT_EQ(std::string(s.getChip()), "v5e");
  EXPECT_EQ(std::string(s.getBaselinePath()), (dir.path() / "kernels/base.py").string());

  ASSERT_EQ(s.getDims().size(), 3u);
  EXPECT_EQ(std::string(s.getDims()[0].getName()), "M");
  EXPECT_EQ(s.getDims()[0].getSize(), 64);
  EXPECT_EQ(std::string(s.getDims()[2].getName()), "N");
  EXPECT_EQ(s.getDims()[2].getSize(), 16);

  ASSERT_EQ(s.getTolerances().size(), 2u);
  EXPECT_EQ(s.getTolerances()[0].getOutput(), 0);
  EXPECT_DOUBLE_EQ(s.getTolerances()[0].getAtol(), 1e-2);
  EXPECT_DOUBLE_EQ(s.getTolerances()[0].getRtol(), 0.02);
  EXPECT_EQ(s.getTolerances()[1].getOutput(), 1);
  EXPECT_DOUBLE_EQ(s.getTolerances()[1].getAtol(), 0.0);

  ASSERT_EQ(s.getConfigurations().size(), 1u);
  auto config = s.getConfigurations()[0];
  EXPECT_EQ(std::string(config.getName()), "default");
  EXPECT_EQ(config.getOutputs().size(), 0u);
  auto in = config.getInputs();
  ASSERT_EQ(in.size(), 12u);

  auto x = in[0];
  EXPECT_EQ(std::string(x.getName()), "x");
  EXPECT_EQ(std::string(x.getType().getDtype()), "bfloat16");
  ASSERT_EQ(x.getType().getShape().size(), 2u);
  EXPECT_EQ(x.getType().getShape()[0], 64);
  EXPECT_EQ(x.getType().getShape()[1], 32);
  ASSERT_EQ(x.getDimNames().size(), 2u);
  EXPECT_EQ(std::string(x.getDimNames()[0]), "M");
  EXPECT_EQ(std::string(x.getDimNames()[1]), "K");
  ASSERT_EQ(x.getGenerator().which(), Generator::NORMAL);
  EXPECT_DOUBLE_EQ(x.getGenerator().getNormal().getMean(), 0.5);
  EXPECT_DOUBLE_EQ(x.getGenerator().getNormal().getStd(), 2.0);
  EXPECT_FALSE(x.getIsStatic());
  EXPECT_FALSE(x.getStructural());

  auto w = in[1];
  EXPECT_EQ(w.getType().getShape()[1], 16);
  EXPECT_EQ(std::string(w.getDimNames()[0]), "K");
  EXPECT_EQ(std::string(w.getDimNames()[1]), "");  // a literal size
  ASSERT_EQ(w.getGenerator().which(), Generator::UNIFORM);
  EXPECT_DOUBLE_EQ(w.getGenerator().getUniform().getLow(), -1.0);
  EXPECT_DOUBLE_EQ(w.getGenerator().getUniform().getHigh(), 1.0);

  auto ids = in[2];
  ASSERT_EQ(ids.getGenerator().which(), Generator::RANDINT);
  EXPECT_EQ(ids.getGenerator().getRandint().getLow(), 0);
  EXPECT_EQ(ids.getGenerator().getRandint().getHigh(), 16);
  EXPECT_TRUE(ids.getStructural());

  auto mask = in[3];
  EXPECT_EQ(std::string(mask.getType().getDtype()), "bool");
  EXPECT_EQ(mask.getGenerator().getRandint().getLow(), 0);
  EXPECT_EQ(mask.getGenerator().getRandint().getHigh(), 2);

  EXPECT_EQ(in[4].getType().getShape().size(), 0u);  // a 0-d array
  EXPECT_EQ(in[4].getGenerator().which(), Generator::ZEROS);
  EXPECT_EQ(in[5].getGenerator().which(), Generator::ONES);
  ASSERT_EQ(in[6].getGenerator().which(), Generator::CODE);
  EXPECT_NE(std::string(in[6].getGenerator().getCode()).find("def generate(rng"),
            std::string::npos);

  auto eps = in[7];
  EXPECT_TRUE(eps.getIsStatic());
  EXPECT_EQ(std::string(eps.getStaticValue()), "1e-05");
  EXPECT_EQ(eps.getType().getShape().size(), 0u);
  EXPECT_EQ(std::string(eps.getType().getDtype()), "");
  EXPECT_EQ(std::string(in[8].getStaticValue()), "128");
  EXPECT_EQ(std::string(in[9].getStaticValue()), "true");
  EXPECT_EQ(std::string(in[10].getStaticValue()), "\"fast \\\"one\\\"\"");
  EXPECT_EQ(std::string(in[11].getType().getDtype()), "float8_e4m3fn");
  EXPECT_EQ(in[11].getGenerator().which(), Generator::NORMAL);  // the float default
}

TEST(NativeSpecLoader, ReferenceFileAndDefaults) {
  temp_spec_dir dir;
  dir.write("src/ref.py", "import jax.numpy as jnp\n\n@jax.jit\ndef reference(a):\n    return a\n");
  auto path = dir.write("task/../spec.yml",
                        "name: t\ninputs:\n  - {name: a, shape: [3, 5], dtype: float32}\n"
                        "reference_file: src/ref.py\n");
  load_result r;
  load(path, r);
  ASSERT_TRUE(r.ok) << r.error.what();
  auto s = r.spec.asReader();
  EXPECT_EQ(std::string(s.getReference()).substr(0, 23), "import jax.numpy as jnp");
  EXPECT_EQ(std::string(s.getSourcePath()), (dir.path() / "spec.yml").string());
  // No tolerance: one global 1e-2/1e-2 (JAXBench's default). No chip: "" (the CLI decides).
  ASSERT_EQ(s.getTolerances().size(), 1u);
  EXPECT_EQ(s.getTolerances()[0].getOutput(), -1);
  EXPECT_DOUBLE_EQ(s.getTolerances()[0].getAtol(), 1e-2);
  EXPECT_DOUBLE_EQ(s.getTolerances()[0].getRtol(), 1e-2);
  EXPECT_EQ(std::string(s.getChip()), "");
  EXPECT_EQ(std::string(s.getBaselinePath()), "");
  EXPECT_EQ(s.getDims().size(), 0u);
  auto a = s.getConfigurations()[0].getInputs()[0];
  EXPECT_EQ(a.getGenerator().which(), Generator::NORMAL);
  EXPECT_DOUBLE_EQ(a.getGenerator().getNormal().getStd(), 1.0);
  EXPECT_EQ(a.getDimNames().size(), 2u);
}

TEST(NativeSpecLoader, ChipOverrideWinsAndIsValidated) {
  temp_spec_dir dir;
  auto path = dir.write("s.yaml",
                        "name: t\ninputs:\n  - {name: a, shape: [4], dtype: float32}\n"
                        "reference: \"def reference(a):\\n  return a\\n\"\ntolerance: {atol: 1, rtol: 2}\n"
                        "chip: v6e\n");
  {
    load_result r;
    load(path, r, {.chip_override = "v7x", .memory_limit_bytes = 1 << 20});
    ASSERT_TRUE(r.ok) << r.error.what();
    EXPECT_EQ(std::string(r.spec.asReader().getChip()), "v7x");
    EXPECT_EQ(r.spec.asReader().getTolerances()[0].getOutput(), -1);
    EXPECT_DOUBLE_EQ(r.spec.asReader().getTolerances()[0].getRtol(), 2.0);
  }
  {
    load_result r;
    load(path, r);
    ASSERT_TRUE(r.ok) << r.error.what();
    EXPECT_EQ(std::string(r.spec.asReader().getChip()), "v6e");
  }
  {
    load_result r;
    load(path, r, {.chip_override = "v6", .memory_limit_bytes = 1 << 20});
    ASSERT_FALSE(r.ok);
    EXPECT_EQ(r.error.field, "--chip");
    EXPECT_NE(r.error.message.find("did you mean 'v6e'"), std::string::npos) << r.error.message;
  }
}

TEST(NativeSpecLoader, MemoryLimitIsTotalInputBytes) {
  temp_spec_dir dir;
  // 2 * 256*256*4 bytes = 512 KiB of inputs; the static argument counts for nothing.
  auto path = dir.write("s.yaml",
                        "name: t\ndims: {M: 256}\ninputs:\n"
                        "  - {name: a, shape: [M, M], dtype: float32}\n"
                        "  - {name: b, shape: [M, M], dtype: float32}\n"
                        "  - {name: s, static: 3}\n"
                        "reference: |\n  def reference(a, b, s):\n    return a\n");
  {
    load_result r;
    load(path, r, {.chip_override = "", .memory_limit_bytes = 2 * 256 * 256 * 4});
    EXPECT_TRUE(r.ok) << r.error.what();
  }
  {
    load_result r;
    load(path, r, {.chip_override = "", .memory_limit_bytes = 2 * 256 * 256 * 4 - 1});
    ASSERT_FALSE(r.ok);
    EXPECT_TRUE(r.error.too_large);
    EXPECT_EQ(r.error.field, "inputs");
    EXPECT_EQ(r.error.line, 4);
    EXPECT_EQ(r.spec.asReader().getName().size(), 0u);  // `out` untouched on failure
  }
}

TEST(NativeSpecLoader, HugeShapesSaturateInsteadOfOverflowing) {
  temp_spec_dir dir;
  // 2^32 * 2^32 * 2 bytes wraps to 0 in 64-bit arithmetic; it must still be too large.
  auto path = dir.write("s.yaml",
                        "name: t\ninputs:\n  - name: a\n    shape: [4294967296, 4294967296]\n"
                        "    dtype: bfloat16\nreference: |\n  def reference(a):\n    return a\n");
  load_result r;
  load(path, r, {.chip_override = "", .memory_limit_bytes = ~0ull});
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(r.error.too_large) << r.error.what();
}

TEST(NativeSpecLoader, BundledMatmulExampleLoads) {
  load_result r;
  load(MAXKERNEL_SOURCE_DIR "/examples/matmul/spec.yaml", r);
  ASSERT_TRUE(r.ok) << r.error.what();
  auto s = r.spec.asReader();
  EXPECT_EQ(std::string(s.getChip()), "v6e");
  auto in = s.getConfigurations()[0].getInputs();
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(std::string(in[0].getType().getDtype()), "bfloat16");
  EXPECT_EQ(in[0].getType().getShape()[1], in[1].getType().getShape()[0]);
  EXPECT_NE(std::string(s.getReference()).find("preferred_element_type=jnp.float32"),
            std::string::npos);
  ASSERT_EQ(s.getTolerances().size(), 1u);
  EXPECT_DOUBLE_EQ(s.getTolerances()[0].getAtol(), 1e-2);
}

TEST(SpecError, WhatFormatsPositionAndField) {
  spec_error e{"spec.yaml", 3, 7, "inputs[1].dtype", "unknown dtype", false};
  EXPECT_EQ(e.what(), "spec.yaml:3:7: inputs[1].dtype: unknown dtype");
  e.column = 0;
  EXPECT_EQ(e.what(), "spec.yaml:3: inputs[1].dtype: unknown dtype");
  e.line = 0;
  e.field.clear();
  EXPECT_EQ(e.what(), "spec.yaml: unknown dtype");
  e.file.clear();
  e.field = "--chip";
  EXPECT_EQ(e.what(), "--chip: unknown dtype");
}

}  // namespace
}  // namespace maxkernel::config::test
