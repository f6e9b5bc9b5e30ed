// A whole-model workload (bench/workloads/*.yaml, docs/workloads.md): the published shape of
// a decoder-only transformer (layers, widths, heads, MoE, MLA) and the batch of one step.
// `maxkernel workload` expands it into the kernel tasks of one step (config/workload_expansion).
// The loader only reads and validates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace maxkernel::config {

// Mixture of experts: routed experts replace the dense MLP in every layer but the first
// `dense_layers`.
struct moe_config {
  uint32_t num_experts = 0;
  uint32_t top_k = 0;
  uint32_t expert_intermediate_size = 0;  // one expert's MLP width
  uint32_t shared_experts = 0;            // always-on experts (DeepSeek), as one wider MLP
  uint32_t dense_layers = 0;              // leading layers with the dense MLP
  std::string scoring = "softmax";        // softmax | sigmoid; top-k weights renormalized
  // Experts are split over this many chips; each holds num_experts / N of them and, with
  // balanced routing, receives tokens x top_k rows (shapes are per chip).
  uint32_t expert_parallelism = 1;
};

// Multi-head latent attention (DeepSeek-V2/V3): low-rank queries and a compressed KV cache.
struct mla_config {
  uint32_t q_lora_rank = 0;  // 0: queries projected directly from the hidden state
  uint32_t kv_lora_rank = 0;
  uint32_t qk_nope_head_dim = 0;
  uint32_t qk_rope_head_dim = 0;
  uint32_t v_head_dim = 0;
};

struct workload_config {
  std::string name;
  std::string description;
  uint32_t layers = 0;
  uint32_t hidden_size = 0;
  uint32_t num_heads = 0;
  uint32_t num_kv_heads = 0;  // defaults to num_heads (no GQA)
  uint32_t head_dim = 0;      // required unless mla is given
  uint32_t intermediate_size = 0;  // the dense MLP's width (required unless every layer is MoE)
  uint32_t vocab_size = 0;
  std::string activation = "silu";  // silu (SwiGLU) | gelu_tanh (GeGLU)
  uint32_t norms_per_layer = 2;     // RMSNorms over the hidden size per layer
  bool qk_norm = false;             // RMSNorm over head_dim of queries and keys (Qwen3, Gemma 3)
  uint32_t sliding_window = 0;      // local layers attend this many tokens (0: none)
  uint32_t global_every = 0;        // with a window: every Nth layer is global (Gemma 3: 6)
  double norm_eps = 1e-6;
  std::string dtype = "bfloat16";   // bfloat16 | float32
  // one step: prefill runs batch x seq_len tokens; decode one token for each of decode_batch
  // sequences against kv_len cached tokens
  uint32_t batch = 0;
  uint32_t seq_len = 0;
  uint32_t decode_batch = 0;  // defaults to batch
  uint32_t kv_len = 0;
  std::optional<moe_config> moe;
  std::optional<mla_config> mla;
  std::string source_path;
};

// Reads and validates a workload file. Unknown keys, wrong types, values out of range and
// inconsistent shapes (heads not a multiple of kv heads, top_k above the experts, ...):
// nullopt with `error` as "FILE:LINE:COLUMN: FIELD: MESSAGE". Never throws.
std::optional<workload_config> load_workload_config(const std::string& path, std::string& error);

// The same on text already read; `file` labels errors.
std::optional<workload_config> parse_workload_config(const std::string& text,
                                                     const std::string& file, std::string& error);

}  // namespace maxkernel::config
