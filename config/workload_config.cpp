#include "config/workload_config.hpp"

#include "config/field_reader.hpp"
#include "config/shown_value.hpp"
#include "config/yaml_config_file.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>

namespace maxkernel::config {

namespace {

constexpr const char* document_field = "(document)";
const std::vector<std::string> keys{
  "name",       "description",  "layers",         "hidden_size",     "num_heads",
  "num_kv_heads", "head_dim",   "intermediate_size", "vocab_size",   "activation",
  "norms_per_layer", "qk_norm", "sliding_window", "global_every",    "norm_eps",
  "dtype",      "batch",        "seq_len",        "decode_batch",    "kv_len",
  "moe",        "mla"};
const std::vector<std::string> moe_keys{"num_experts",    "top_k",        "expert_intermediate_size",
                                        "shared_experts", "dense_layers", "scoring",
                                        "expert_parallelism"};
const std::vector<std::string> mla_keys{"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                        "qk_rope_head_dim", "v_head_dim"};

// Widths beyond any published model catch typos (an extra zero) before a task asks for
// terabytes; the spec loader's memory limit is the real bound.
constexpr int64_t max_width = 1 << 20;
constexpr int64_t max_tokens = 1 << 24;

uint32_t read_size(const field_reader& r, const YAML::Node& n, const std::string& field,
                   int64_t low, int64_t high) {
  int64_t v = r.integer(n, field);
  if (v < low || v > high)
    r.fail(n, field, fmt::format("expected an integer from {} to {}, got {}", low, high, v));
  return static_cast<uint32_t>(v);
}

std::string read_choice(const field_reader& r, const YAML::Node& n, const std::string& field,
                        const std::vector<std::string>& choices) {
  std::string v = r.string(n, field);
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
    std::string list;
    for (const auto& c : choices)
      list += (list.empty() ? "" : ", ") + c;
    r.fail(n, field, fmt::format("'{}' is not one of {}", shown_value(v), list));
  }
  return v;
}

// The entry's node for messages about a field (or the document when it is absent).
const YAML::Node& at(const yaml_mapping& m, const YAML::Node& root, const char* key) {
  const yaml_entry* e = m.find(key);
  return e ? e->value : root;
}

moe_config parse_moe(const YAML::Node& node, const field_reader& r) {
  moe_config c;
  auto m = r.mapping(node, "moe", moe_keys);
  for (const auto& e : m.entries) {
    std::string f = child_field("moe", e.key);
    const auto& v = e.value;
    if (e.key == "num_experts")
      c.num_experts = read_size(r, v, f, 1, 65536);
    else if (e.key == "top_k")
      c.top_k = read_size(r, v, f, 1, 65536);
    else if (e.key == "expert_intermediate_size")
      c.expert_intermediate_size = read_size(r, v, f, 1, max_width);
    else if (e.key == "shared_experts")
      c.shared_experts = read_size(r, v, f, 0, 64);
    else if (e.key == "dense_layers")
      c.dense_layers = read_size(r, v, f, 0, 100000);
    else if (e.key == "scoring")
      c.scoring = read_choice(r, v, f, {"softmax", "sigmoid"});
    else if (e.key == "expert_parallelism")
      c.expert_parallelism = read_size(r, v, f, 1, 65536);
  }
  for (const char* k : {"num_experts", "top_k", "expert_intermediate_size"})
    if (!m.find(k))
      r.fail(node, "moe", fmt::format("missing required key `{}`", k));
  if (c.top_k > c.num_experts)
    r.fail(at(m, node, "top_k"), "moe.top_k",
           fmt::format("top_k {} exceeds num_experts {}", c.top_k, c.num_experts));
  if (c.num_experts % c.expert_parallelism != 0)
    r.fail(at(m, node, "expert_parallelism"), "moe.expert_parallelism",
           fmt::format("num_experts {} is not a multiple of expert_parallelism {}",
                       c.num_experts, c.expert_parallelism));
  return c;
}

mla_config parse_mla(const YAML::Node& node, const field_reader& r) {
  mla_config c;
  auto m = r.mapping(node, "mla", mla_keys);
  for (const auto& e : m.entries) {
    std::string f = child_field("mla", e.key);
    const auto& v = e.value;
    if (e.key == "q_lora_rank")
      c.q_lora_rank = read_size(r, v, f, 0, max_width);
    else if (e.key == "kv_lora_rank")
      c.kv_lora_rank = read_size(r, v, f, 1, max_width);
    else if (e.key == "qk_nope_head_dim")
      c.qk_nope_head_dim = read_size(r, v, f, 1, 4096);
    else if (e.key == "qk_rope_head_dim")
      c.qk_rope_head_dim = read_size(r, v, f, 2, 4096);
    else if (e.key == "v_head_dim")
      c.v_head_dim = read_size(r, v, f, 1, 4096);
  }
  for (const char* k : {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
    if (!m.find(k))
      r.fail(node, "mla", fmt::format("missing required key `{}`", k));
  if (c.qk_rope_head_dim % 2 != 0)
    r.fail(at(m, node, "qk_rope_head_dim"), "mla.qk_rope_head_dim",
           fmt::format("RoPE rotates pairs: {} is odd", c.qk_rope_head_dim));
  return c;
}

workload_config parse(const YAML::Node& root, const field_reader& r) {
  if (!root.IsDefined() || root.IsNull() || !root.IsMap())  // an empty file has no mark: line 1
    throw_config_error(r.file(), root.IsDefined() ? root.Mark() : YAML::Mark::null_mark(), document_field,
                fmt::format("a workload is a mapping (name: ..., layers: ..., ...), got {}",
                            field_reader::describe(root)));
  workload_config c;
  auto m = r.mapping(root, "", keys);
  for (const auto& e : m.entries) {
    const std::string& f = e.key;
    const YAML::Node& v = e.value;
    if (f == "name") {
      c.name = r.string(v, f);
      bool ok = !c.name.empty() && c.name.size() <= 128;
      for (char ch : c.name)
        ok &= std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '-';
      if (!ok)
        r.fail(v, f, fmt::format("'{}' is not a name of 1-128 of [A-Za-z0-9_.-]",
                                 shown_value(c.name)));
    } else if (f == "description") {
      c.description = r.text(v, f);
    } else if (f == "layers") {
      c.layers = read_size(r, v, f, 1, 100000);
    } else if (f == "hidden_size") {
      c.hidden_size = read_size(r, v, f, 1, max_width);
    } else if (f == "num_heads") {
      c.num_heads = read_size(r, v, f, 1, 4096);
    } else if (f == "num_kv_heads") {
      c.num_kv_heads = read_size(r, v, f, 1, 4096);
    } else if (f == "head_dim") {
      c.head_dim = read_size(r, v, f, 1, 4096);
    } else if (f == "intermediate_size") {
      c.intermediate_size = read_size(r, v, f, 1, max_width);
    } else if (f == "vocab_size") {
      c.vocab_size = read_size(r, v, f, 1, 1 << 24);
    } else if (f == "activation") {
      c.activation = read_choice(r, v, f, {"silu", "gelu_tanh"});
    } else if (f == "norms_per_layer") {
      c.norms_per_layer = read_size(r, v, f, 0, 16);
    } else if (f == "qk_norm") {
      c.qk_norm = r.boolean(v, f);
    } else if (f == "sliding_window") {
      c.sliding_window = read_size(r, v, f, 0, max_tokens);
    } else if (f == "global_every") {
      c.global_every = read_size(r, v, f, 0, 100000);
    } else if (f == "norm_eps") {
      c.norm_eps = r.number(v, f);
      if (!(c.norm_eps > 0 && c.norm_eps < 1))
        r.fail(v, f, fmt::format("expected a number between 0 and 1, got {}", c.norm_eps));
    } else if (f == "dtype") {
      c.dtype = read_choice(r, v, f, {"bfloat16", "float32"});
    } else if (f == "batch") {
      c.batch = read_size(r, v, f, 1, max_tokens);
    } else if (f == "seq_len") {
      c.seq_len = read_size(r, v, f, 1, max_tokens);
    } else if (f == "decode_batch") {
      c.decode_batch = read_size(r, v, f, 1, max_tokens);
    } else if (f == "kv_len") {
      c.kv_len = read_size(r, v, f, 1, max_tokens);
    } else if (f == "moe") {
      c.moe = parse_moe(v, r);
    } else if (f == "mla") {
      c.mla = parse_mla(v, r);
    }
  }
  std::vector<const char*> required{"name", "layers", "hidden_size", "num_heads", "vocab_size",
                                    "batch", "seq_len", "kv_len"};
  if (!c.mla)
    required.push_back("head_dim");
  if (!c.moe || c.moe->dense_layers > 0 || c.moe->shared_experts > 0)
    required.push_back("intermediate_size");
  for (const char* k : required)
    if (!m.find(k))
      r.fail(root, k,
             fmt::format("missing required key `{}`{}", k,
                         std::string(k) == "head_dim" ? " (needed without mla)"
                         : std::string(k) == "intermediate_size"
                           ? " (the dense MLP's width: needed without moe, or with dense_layers "
                             "or shared_experts)"
                           : ""));
  if (c.num_kv_heads == 0)
    c.num_kv_heads = c.num_heads;
  if (c.mla && m.find("num_kv_heads") && c.num_kv_heads != c.num_heads)
    r.fail(at(m, root, "num_kv_heads"), "num_kv_heads",
           "MLA attends with every head (its cache is one shared latent): leave num_kv_heads out");
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail(at(m, root, "num_kv_heads"), "num_kv_heads",
           fmt::format("num_heads {} is not a multiple of num_kv_heads {} (query heads share kv "
                       "heads in equal groups)",
                       c.num_heads, c.num_kv_heads));
  if (c.decode_batch == 0)
    c.decode_batch = c.batch;
  if (c.global_every > 0 && c.sliding_window == 0)
    r.fail(at(m, root, "global_every"), "global_every",
           "global_every picks the global layers among windowed ones: give sliding_window too");
  if (c.moe && c.moe->dense_layers > c.layers)
    r.fail(m.find("moe")->value, "moe.dense_layers",
           fmt::format("dense_layers {} exceeds layers {}", c.moe->dense_layers, c.layers));
  return c;
}

}  // namespace

std::optional<workload_config> parse_workload_config(const std::string& text,
                                                     const std::string& file,
                                                     std::string& error) {
  workload_config c;
  field_reader reader(file);
  if (!parse_config_document(text, file, "the workload",
                             [&](const YAML::Node& root) { c = parse(root, reader); }, error))
    return std::nullopt;
  c.source_path = file;
  return c;
}

std::optional<workload_config> load_workload_config(const std::string& path, std::string& error) {
  auto text = read_config_file(path, error);
  if (!text)
    return std::nullopt;
  return parse_workload_config(*text, path, error);
}

}  // namespace maxkernel::config
