// Workload files (bench/workloads/*.yaml): every shipped model loads with its published
// values, defaults apply, and each bad field fails naming its file, line and field.
#include "config/workload_config.hpp"

#include <gtest/gtest.h>

#include <filesystem>

namespace maxkernel::config::test {
namespace {

namespace fs = std::filesystem;

const std::string minimal = R"(name: tiny
layers: 2
hidden_size: 64
num_heads: 4
num_kv_heads: 2
head_dim: 16
intermediate_size: 128
vocab_size: 256
batch: 2
seq_len: 32
kv_len: 64
)";

workload_config parse_ok(const std::string& text) {
  std::string error;
  auto c = parse_workload_config(text, "w.yaml", error);
  EXPECT_TRUE(c.has_value()) << error;
  return c.value_or(workload_config{});
}

std::string parse_bad(const std::string& text) {
  std::string error;
  auto c = parse_workload_config(text, "w.yaml", error);
  EXPECT_FALSE(c.has_value()) << text;
  return error;
}

workload_config load_shipped(const std::string& stem) {
  std::string path = std::string(MAXKERNEL_SOURCE_DIR) + "/bench/workloads/" + stem + ".yaml";
  std::string error;
  auto c = load_workload_config(path, error);
  EXPECT_TRUE(c.has_value()) << error;
  return c.value_or(workload_config{});
}

TEST(WorkloadConfig, EveryShippedWorkloadLoads) {
  fs::path dir = fs::path(MAXKERNEL_SOURCE_DIR) / "bench/workloads";
  unsigned n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml")
      continue;
    std::string error;
    auto c = load_workload_config(e.path().string(), error);
    EXPECT_TRUE(c.has_value()) << error;
    if (c) {
      EXPECT_EQ(c->name + ".yaml", e.path().filename().string()) << "file named after the model";
    }
    ++n;
  }
  EXPECT_GE(n, 6u);
}

TEST(WorkloadConfig, PublishedValuesOfTwoModels) {
  auto llama = load_shipped("llama-3.1-70b");
  EXPECT_EQ(llama.layers, 80u);
  EXPECT_EQ(llama.hidden_size, 8192u);
  EXPECT_EQ(llama.num_heads, 64u);
  EXPECT_EQ(llama.num_kv_heads, 8u);
  EXPECT_EQ(llama.intermediate_size, 28672u);
  EXPECT_EQ(llama.vocab_size, 128256u);
  EXPECT_FALSE(llama.moe);
  EXPECT_FALSE(llama.mla);

  auto ds = load_shipped("deepseek-v3");
  ASSERT_TRUE(ds.moe);
  ASSERT_TRUE(ds.mla);
  EXPECT_EQ(ds.layers, 61u);
  EXPECT_EQ(ds.num_kv_heads, ds.num_heads);  // MLA: every head
  EXPECT_EQ(ds.moe->num_experts, 256u);
  EXPECT_EQ(ds.moe->top_k, 8u);
  EXPECT_EQ(ds.moe->dense_layers, 3u);
  EXPECT_EQ(ds.moe->shared_experts, 1u);
  EXPECT_EQ(ds.moe->scoring, "sigmoid");
  EXPECT_EQ(ds.mla->kv_lora_rank, 512u);
  EXPECT_EQ(ds.mla->qk_rope_head_dim, 64u);

  auto gemma = load_shipped("gemma-3-27b");
  EXPECT_EQ(gemma.activation, "gelu_tanh");
  EXPECT_EQ(gemma.sliding_window, 1024u);
  EXPECT_EQ(gemma.global_every, 6u);
  EXPECT_TRUE(gemma.qk_norm);
}

TEST(WorkloadConfig, Defaults) {
  auto c = parse_ok(minimal);
  EXPECT_EQ(c.decode_batch, 2u);  // the batch
  EXPECT_EQ(c.activation, "silu");
  EXPECT_EQ(c.norms_per_layer, 2u);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.source_path, "w.yaml");
  auto mha = parse_ok(R"(name: mha
layers: 1
hidden_size: 64
num_heads: 4
head_dim: 16
intermediate_size: 128
vocab_size: 256
batch: 1
seq_len: 8
kv_len: 8
)");
  EXPECT_EQ(mha.num_kv_heads, 4u);  // no GQA
}

struct bad_case {
  std::string replace;  // a line of `minimal`, or "" to append
  std::string with;
  std::string expect;   // a substring of the error
};

std::string edited(const bad_case& c) {
  std::string text = minimal;
  if (c.replace.empty())
    return text + c.with;
  auto at = text.find(c.replace);
  EXPECT_NE(at, std::string::npos) << c.replace;
  return text.replace(at, c.replace.size(), c.with);
}

TEST(WorkloadConfig, EachBadFieldNamesFileLineAndField) {
  const std::vector<bad_case> cases{
    {"layers: 2\n", "layers: 0\n", "w.yaml:2:9: layers: expected an integer from 1"},
    {"layers: 2\n", "layers: two\n", "w.yaml:2:9: layers:"},
    {"layers: 2\n", "", "w.yaml:1:1: layers: missing required key `layers`"},
    {"head_dim: 16\n", "", "head_dim: missing required key `head_dim` (needed without mla)"},
    {"intermediate_size: 128\n", "", "intermediate_size: missing required key"},
    {"num_kv_heads: 2\n", "num_kv_heads: 3\n",
     "w.yaml:5:15: num_kv_heads: num_heads 4 is not a multiple of num_kv_heads 3"},
    {"name: tiny\n", "name: a b\n", "w.yaml:1:7: name: 'a b' is not a name"},
    {"", "hiden_size: 64\n", "w.yaml:12:1"},
    {"", "activation: relu\n", "w.yaml:12:13: activation: 'relu' is not one of silu, gelu_tanh"},
    {"", "dtype: int8\n", "dtype: 'int8' is not one of bfloat16, float32"},
    {"", "norm_eps: 2\n", "norm_eps: expected a number between 0 and 1"},
    {"", "qk_norm: maybe\n", "w.yaml:12:10: qk_norm:"},
    {"", "global_every: 6\n", "global_every: global_every picks the global layers"},
    {"", "moe: {num_experts: 8, top_k: 9, expert_intermediate_size: 32}\n",
     "moe.top_k: top_k 9 exceeds num_experts 8"},
    {"", "moe: {num_experts: 8, top_k: 2}\n",
     "moe: missing required key `expert_intermediate_size`"},
    {"", "moe: {num_experts: 8, top_k: 2, expert_intermediate_size: 32, expert_parallelism: 3}\n",
     "moe.expert_parallelism: num_experts 8 is not a multiple of expert_parallelism 3"},
    {"", "moe: {num_experts: 8, top_k: 2, expert_intermediate_size: 32, dense_layers: 3}\n",
     "moe.dense_layers: dense_layers 3 exceeds layers 2"},
    {"", "moe: {num_experts: 8, top_k: 2, expert_intermediate_size: 32, scoring: relu}\n",
     "moe.scoring: 'relu' is not one of softmax, sigmoid"},
    {"", "moe: {num_experts: 8, top_k: 2, expert_intermediate_size: 32, expert: 1}\n",
     "w.yaml:12"},
    {"", "mla: {kv_lora_rank: 64, qk_nope_head_dim: 16, qk_rope_head_dim: 9, v_head_dim: 16}\n",
     "mla.qk_rope_head_dim: RoPE rotates pairs: 9 is odd"},
    {"", "mla: {kv_lora_rank: 64, qk_nope_head_dim: 16, v_head_dim: 16}\n",
     "mla: missing required key `qk_rope_head_dim`"},
    {"num_kv_heads: 2\n",
     "num_kv_heads: 2\nmla: {kv_lora_rank: 64, qk_nope_head_dim: 16, qk_rope_head_dim: 8, "
     "v_head_dim: 16}\n",
     "num_kv_heads: MLA attends with every head"},
    {"", "batch: 3\n", "w.yaml:12:1: batch: duplicate key"},
  };
  for (const auto& c : cases) {
    std::string error = parse_bad(edited(c));
    EXPECT_NE(error.find(c.expect), std::string::npos)
      << "expected `" << c.expect << "` in: " << error << "\nfor:\n" << edited(c);
  }
}

TEST(WorkloadConfig, NotAMappingAndMissingFile) {
  for (const char* text : {"", "- layers: 2\n"}) {
    std::string error = parse_bad(text);
    EXPECT_NE(error.find("w.yaml:1:1: (document): a workload is a mapping"), std::string::npos)
      << error;
  }
  std::string error;
  EXPECT_FALSE(load_workload_config("/nonexistent/model.yaml", error));
  EXPECT_NE(error.find("/nonexistent/model.yaml"), std::string::npos) << error;
}

}  // namespace
}  // namespace maxkernel::config::test
