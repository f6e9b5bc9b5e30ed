// The expansion of a model into the kernel tasks of one step: task count and deduplication
// for dense, MoE, MLA and windowed models; occurrences sum to layers x per-layer kernels plus
// the head; shapes follow the config; every emitted spec loads as a native spec.
#include "config/workload_expansion.hpp"

#include "temp_spec_dir.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace maxkernel::config::test {
namespace {

workload_config shipped(const std::string& stem) {
  std::string path = std::string(MAXKERNEL_SOURCE_DIR) + "/bench/workloads/" + stem + ".yaml";
  std::string error;
  auto c = load_workload_config(path, error);
  EXPECT_TRUE(c.has_value()) << error;
  return c.value_or(workload_config{});
}

// role -> task (a role appears in exactly one task per expansion unless its shapes differ)
std::map<std::string, const workload_task*> by_role(const std::vector<workload_task>& tasks) {
  std::map<std::string, const workload_task*> m;
  for (const auto& t : tasks)
    for (const auto& r : t.roles)
      m[r] = &t;
  return m;
}

int64_t dim_of(const workload_task& t, const std::string& name) {
  for (const auto& [n, v] : t.dims)
    if (n == name)
      return v;
  ADD_FAILURE() << t.name << " has no dim " << name;
  return -1;
}

uint64_t total(const std::vector<workload_task>& tasks) {
  uint64_t n = 0;
  for (const auto& t : tasks)
    n += t.occurrences;
  return n;
}

TEST(WorkloadExpansion, DenseModelPrefill) {
  auto m = shipped("llama-3.1-8b");
  auto tasks = expand_workload(m, workload_phase::prefill);
  // rmsnorm (2 per layer + the final one, same shape: one task), qkv, attention, o, mlp,
  // logits + cross-entropy
  ASSERT_EQ(tasks.size(), 6u);
  auto roles = by_role(tasks);
  const auto* norm = roles.at("rmsnorm");
  EXPECT_EQ(norm, roles.at("final_norm"));  // deduplicated: same shapes
  EXPECT_EQ(norm->occurrences, 2u * m.layers + 1);
  for (const char* r : {"qkv_projection", "attention", "o_projection", "mlp"})
    EXPECT_EQ(roles.at(r)->occurrences, m.layers) << r;
  EXPECT_EQ(roles.at("logits_cross_entropy")->occurrences, 1u);
  // 6 kernels per layer (2 norms, qkv, attention, o, mlp) and 2 in the head
  EXPECT_EQ(total(tasks), 6u * m.layers + 2);
  // shapes of the whole step
  const auto& qkv = *roles.at("qkv_projection");
  EXPECT_EQ(dim_of(qkv, "M"), int64_t{m.batch} * m.seq_len);
  EXPECT_EQ(dim_of(qkv, "K"), m.hidden_size);
  EXPECT_EQ(dim_of(qkv, "N"), int64_t{m.num_heads + 2 * m.num_kv_heads} * m.head_dim);
  const auto& attn = *roles.at("attention");
  EXPECT_EQ(attn.kind, "attention");
  EXPECT_EQ(dim_of(attn, "HKV"), m.num_kv_heads);
  EXPECT_EQ(dim_of(attn, "G"), m.num_heads / m.num_kv_heads);
  EXPECT_EQ(dim_of(attn, "S"), m.seq_len);
  EXPECT_EQ(dim_of(*roles.at("mlp"), "F"), m.intermediate_size);
  EXPECT_EQ(dim_of(*roles.at("logits_cross_entropy"), "V"), m.vocab_size);
}

TEST(WorkloadExpansion, ShapesFollowTheConfigOfASecondDenseModel) {
  auto m = shipped("llama-3.1-70b");
  auto tasks = expand_workload(m, workload_phase::decode);
  ASSERT_EQ(tasks.size(), 6u);
  EXPECT_EQ(total(tasks), 6u * 80 + 2);
  auto roles = by_role(tasks);
  const auto& qkv = *roles.at("qkv_projection");
  EXPECT_EQ(dim_of(qkv, "M"), 64);  // decode: one token per sequence
  EXPECT_EQ(dim_of(qkv, "K"), 8192);
  EXPECT_EQ(dim_of(qkv, "N"), (64 + 2 * 8) * 128);
  const auto& attn = *roles.at("attention");
  EXPECT_EQ(attn.kind, "decode_attention");
  EXPECT_EQ(dim_of(attn, "L"), 4096);
  EXPECT_EQ(dim_of(attn, "G"), 8);
  EXPECT_EQ(dim_of(*roles.at("o_projection"), "K"), 64 * 128);
  EXPECT_EQ(dim_of(*roles.at("mlp"), "F"), 28672);
  const auto& logits = *roles.at("logits");
  EXPECT_EQ(logits.kind, "matmul");
  EXPECT_EQ(dim_of(logits, "N"), 128256);
}

TEST(WorkloadExpansion, MoeModelDecode) {
  auto m = shipped("mixtral-8x7b");
  auto tasks = expand_workload(m, workload_phase::decode);
  // rmsnorm, qkv, attention, o, router, expert_ffn, logits
  ASSERT_EQ(tasks.size(), 7u);
  auto roles = by_role(tasks);
  EXPECT_FALSE(roles.count("mlp"));
  EXPECT_EQ(roles.at("router")->occurrences, 32u);
  const auto& ffn = *roles.at("expert_ffn");
  EXPECT_EQ(ffn.occurrences, 32u);
  EXPECT_EQ(dim_of(ffn, "M"), 64 * 2);  // tokens x top_k rows
  EXPECT_EQ(dim_of(ffn, "G"), 8);
  EXPECT_EQ(dim_of(ffn, "F"), 14336);
  EXPECT_EQ(dim_of(*roles.at("router"), "X"), 8);
  EXPECT_EQ(total(tasks), 7u * 32 + 2);
}

TEST(WorkloadExpansion, MlaMoeWithDenseLayersAndSharedExpert) {
  auto m = shipped("deepseek-v3");
  auto prefill = expand_workload(m, workload_phase::prefill);
  auto roles = by_role(prefill);
  EXPECT_EQ(roles.at("mlp")->occurrences, 3u);  // first_k_dense_replace
  EXPECT_EQ(dim_of(*roles.at("mlp"), "F"), 18432);
  EXPECT_EQ(roles.at("router")->occurrences, 58u);
  EXPECT_EQ(roles.at("shared_expert_mlp")->occurrences, 58u);
  EXPECT_EQ(dim_of(*roles.at("shared_expert_mlp"), "F"), 2048);
  EXPECT_EQ(dim_of(*roles.at("expert_ffn"), "G"), 256 / 32);  // experts on one chip
  EXPECT_EQ(dim_of(*roles.at("mla_down_projection"), "N"), 1536 + 512 + 64);
  EXPECT_EQ(dim_of(*roles.at("kv_up_projection"), "N"), 128 * (128 + 128));
  const auto& attn = *roles.at("attention");
  EXPECT_EQ(dim_of(attn, "G"), 1);
  EXPECT_EQ(dim_of(attn, "D"), 192);
  EXPECT_EQ(dim_of(attn, "DV"), 128);
  // per layer: 2 norms, down, q norm, q up, kv norm, kv up, attention, o = 9; then 1 mlp
  // (dense) or router + experts + shared = 3; head 2
  EXPECT_EQ(total(prefill), 61u * 9 + 3 * 1 + 58 * 3 + 2);

  auto decode = expand_workload(m, workload_phase::decode);
  auto droles = by_role(decode);
  EXPECT_FALSE(droles.count("kv_up_projection"));  // absorbed
  const auto& mla = *droles.at("mla_decode_attention");
  EXPECT_EQ(mla.occurrences, 61u);
  EXPECT_EQ(dim_of(mla, "KVL"), 512);
  EXPECT_EQ(dim_of(mla, "L"), 4096);
  EXPECT_EQ(total(decode), 61u * 8 + 3 + 58 * 3 + 2);
}

TEST(WorkloadExpansion, SlidingWindowSplitsLocalAndGlobalLayers) {
  auto m = shipped("gemma-3-27b");
  auto decode = expand_workload(m, workload_phase::decode);
  auto roles = by_role(decode);
  EXPECT_EQ(roles.at("attention")->occurrences, 62u / 6);  // layers 6, 12, ..., 60
  EXPECT_EQ(roles.at("local_attention")->occurrences, 62u - 62 / 6);
  EXPECT_EQ(dim_of(*roles.at("local_attention"), "L"), 1024);
  EXPECT_EQ(dim_of(*roles.at("attention"), "L"), 4096);
  EXPECT_EQ(roles.at("rmsnorm")->occurrences, 4u * 62 + 1);
  EXPECT_NE(roles.at("q_norm"), roles.at("k_norm"));  // 32 vs 16 heads
  EXPECT_EQ(dim_of(*roles.at("k_norm"), "H"), 16);
  auto prefill = expand_workload(m, workload_phase::prefill);
  auto proles = by_role(prefill);
  ASSERT_NE(proles.at("local_attention"), proles.at("attention"));
  EXPECT_NE(proles.at("local_attention")->spec.find("window"), std::string::npos);
  EXPECT_EQ(proles.at("attention")->spec.find("window"), std::string::npos);
}

TEST(WorkloadExpansion, SameShapesMergeAcrossRoles) {
  workload_config m;
  m.name = "tiny";
  m.layers = 3;
  m.hidden_size = 64;
  m.num_heads = m.num_kv_heads = 4;
  m.head_dim = 16;
  m.intermediate_size = 64;  // the MLP's width equals the hidden size
  m.vocab_size = 64;
  m.qk_norm = true;
  m.batch = m.decode_batch = 2;
  m.seq_len = 8;
  m.kv_len = 8;
  m.sliding_window = 16;  // wider than the cache: local and global attention are the same
  m.global_every = 2;
  auto tasks = expand_workload(m, workload_phase::decode);
  auto roles = by_role(tasks);
  EXPECT_EQ(roles.at("q_norm"), roles.at("k_norm"));  // H == HKV
  EXPECT_EQ(roles.at("q_norm")->occurrences, 6u);
  EXPECT_EQ(roles.at("attention"), roles.at("local_attention"));
  EXPECT_EQ(roles.at("attention")->occurrences, 3u);
  // o_projection [T, H*D=64] @ [64, 64] and logits are different tasks (f32 out)
  EXPECT_NE(roles.at("o_projection"), roles.at("logits"));
  std::set<std::string> names;
  for (const auto& t : tasks)
    EXPECT_TRUE(names.insert(t.name).second) << "duplicate name " << t.name;
}

// Every task of every shipped model, in both phases, is a valid native spec within the
// default memory limit, and the names are unique.
TEST(WorkloadExpansion, EverySpecLoads) {
  temp_spec_dir dir;
  for (const char* stem : {"llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen3-235b-a22b",
                           "deepseek-v3", "gemma-3-27b"})
    for (auto phase : {workload_phase::prefill, workload_phase::decode}) {
      auto m = shipped(stem);
      auto tasks = expand_workload(m, phase);
      std::set<std::string> names;
      for (const auto& t : tasks) {
        EXPECT_TRUE(names.insert(t.name).second) << stem << ": duplicate " << t.name;
        EXPECT_GE(t.occurrences, 1u);
        std::string rel = std::string(stem) + "/" + phase_name(phase) + "/" + t.name + ".yaml";
        load_result r;
        load(dir.write(rel, t.spec), r);
        EXPECT_TRUE(r.ok) << rel << ": " << r.error.what() << "\n" << t.spec;
        if (r.ok) {
          EXPECT_EQ(std::string(r.spec.getName().cStr()),
                    m.name + "_" + phase_name(phase) + "_" + t.name);
        }
      }
    }
}

}  // namespace
}  // namespace maxkernel::config::test
