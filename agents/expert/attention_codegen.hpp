// Python code for an attention_pattern, shared by the attention templates: the sizes of the
// loop indices read from the inputs at trace time (shape-generic), the views that bring each
// operand to a (kv rows..., rows, lanes) layout a BlockSpec can tile (free reshapes where the
// memory order allows, a transpose otherwise), the score function and the mask generated
// from the reference's own equations, and the pre-operations on Q, K and V tiles.
#pragma once

#include "agents/expert/attention_pattern.hpp"
#include "agents/expert/kernel_template.hpp"
#include "maxkernel/schema/kernel_spec.capnp.h"

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

// Heads per block of the attention templates (facts "head_axis", params "block_h"): the
// tunable when the match has a head axis, and the count a params object asks for (1 without).
std::optional<tunable> heads_tunable(const nlohmann::json& facts);
int64_t heads_per_block(const nlohmann::json& facts, const nlohmann::json& params);

// A Python view of one operand: `code` assigns `var` from the base; `axes` is the descriptor
// list the templates' _block_shape/_index_map read ("c" grid axis, rows, keys, lane, full,
// unit). For the output, `code` turns `var` (the kernel's result) into the graph output.
struct operand_view {
  std::string var;
  std::string code;
  std::string axes;
  std::string shape;       // the view's shape as a Python tuple expression
  bool transposed = false;
  std::vector<int> lead_c;  // kv-row (c) axes of its leading dimensions, in order
  std::vector<int> lane_c;  // c axes merged into its lane dimension
};

class attention_codegen {
public:
  attention_codegen(const graph_view& g, const attention_pattern& p,
                    schema::KernelSpec::Reader spec);

  // Paged mode: K and V are read from page pools by the template itself (no views); the
  // pools' and tables' axes are extra sources for the index sizes.
  void set_external_kv(std::vector<std::pair<std::string, axis_indices>> size_sources) {
    external_kv_ = true;
    extra_sources_ = std::move(size_sources);
  }

  // Nodes the template accounts for itself (a paged cache's gathers).
  void add_known_nodes(const std::vector<int>& nodes) {
    known_.insert(nodes.begin(), nodes.end());
  }

  // false with `why` when something cannot be generated.
  bool build(std::string& why);

  // Code computing the operands the reference computes before the attention (projections,
  // norms, rotary embeddings) as XLA ops, and the output from the attention result after it
  // (an output projection); empty when there is none. `result` is what workload returns.
  const std::string& prologue_code() const { return prologue_code_; }
  const std::string& epilogue_code() const { return epilogue_code_; }
  const std::string& result() const { return result_; }

  // Python expression of a leaf's size (its variable, n<id>).
  std::string size_of(int leaf) const;
  int c_axis(int leaf) const;          // grid axis of a kv-row leaf, -1 otherwise
  std::string arg(int input) const;    // workload parameter name of graph input k

  // workload(...) parameter list.
  std::string signature() const;
  // Lines defining every leaf size.
  const std::string& sizes_code() const { return sizes_code_; }
  // Views (assignments) of the score terms' Q and K, V, the tile and scalar inputs.
  const std::vector<operand_view>& q_views() const { return q_views_; }
  const std::vector<operand_view>& k_views() const { return k_views_; }
  const operand_view& v_view() const { return v_view_; }
  const std::vector<operand_view>& tile_views() const { return tile_views_; }
  const std::vector<operand_view>& scalar_views() const { return scalar_views_; }
  const std::vector<std::vector<int>>& scalar_c() const { return scalar_c_; }
  const operand_view& out_view() const { return out_view_; }
  // def _pre_<name>(x, xp) for each operand; def _score(s, ix, xp); def _kill(ix, xp).
  // (They read the index sizes: define them inside workload, after sizes_code.)
  const std::string& functions() const { return functions_; }
  // Module-level helpers the prologue and epilogue code call.
  const std::string& module_code() const { return module_code_; }
  bool has_kill() const { return has_kill_; }
  bool kill_static() const { return kill_static_; }
  // `_score_live` was emitted: the scores of a block where the mask kills nothing, its
  // mask selects replaced by the branch they take there.
  bool has_live_score() const { return has_live_score_; }
  bool kill_rows() const { return kill_rows_; }
  const std::vector<int>& kill_c() const { return kill_c_; }
  // Per term: the dtype its Q K^T runs in, and the dtype of its result in the reference.
  const std::vector<std::pair<std::string, std::string>>& term_dtypes() const { return term_dtypes_; }
  std::string v_storage_dtype() const { return v_storage_dtype_; }
  // The term whose K tile is also V (same input, same layout), -1 when V has its own.
  int v_shared_with() const { return v_share_; }
  // A kv-row axis a block may hold several of (heads): a leading dimension of every q and
  // output view, of every k and v view or of none of them (shared by the heads), in no
  // view's lanes, read by neither the mask tables nor the score function nor the scalars;
  // -1 when none is. With external (paged) keys and values, only q, output and tiles.
  int head_axis() const;
  int row_align() const { return row_align_; }
  std::string c_sizes() const;         // Python tuple of the kv-row sizes
  std::string rows_size() const;       // Python expression of the number of rows
  std::string keys_size() const;

  // Full-size extents (configuration 0) for the parameters and the VMEM estimate.
  int64_t rows_extent() const;
  int64_t keys_extent() const;
  std::vector<int64_t> qk_dims() const;  // per term
  int64_t value_extent() const;
  int itemsize_q() const { return q_item_; }
  int itemsize_kv() const { return kv_item_; }
  int itemsize_out() const { return out_item_; }
  int tile_bytes_per_elem() const { return tile_item_; }
  std::string summary() const;
  nlohmann::json facts() const;

private:
  bool solve_sizes(std::string& why);
  bool make_view(const std::string& var, const std::string& base, const axis_indices& base_axes,
                 const index_list& sub, const char* sub_kind, const index_list& lane,
                 bool lane_merge_ok, bool output, operand_view& out, std::string& why);
  std::string literal(const std::string& json, const std::string& dtype, bool in_region) const;
  // A float literal the reference computed from its sizes (a scale (d_nope + d_rope) ** -0.5):
  // the same formula over the sizes read at trace time, "" when none fits it unambiguously.
  void collect_feature_sizes();
  // plain: the size itself (the operand of a sqrt, jnp.sqrt(jnp.float32(d))).
  std::string size_formula(double value, bool plain = false) const;
  std::string root_formula(int node, unsigned k) const;
  std::string ew_expr(int node, const std::vector<std::string>& ops, std::string& why) const;
  std::string const_expr(const value_ref& v, const std::string& dtype, std::string& why) const;
  std::string region_operand(int node, unsigned k, std::string& why) const;
  std::string iota_expr(int node, const axis_indices& axes, std::string& why) const;
  bool emit_region(std::string& why);
  bool emit_preops(const traced_operand& t, const std::string& name, bool drop_trailing_casts,
                   std::string& why);
  std::string kill_of(const value_ref& v);
  std::string kill_node(int node);
  // The operands whose kill the node's result inherits as an or (casts, layout, add, sub's
  // first, min, positive scaling; empty: the node kills nothing), nullopt for any other node.
  std::optional<std::vector<unsigned>> kill_or_operands(int node) const;
  // The operand (1 or 2) a select takes wherever the scores are not killed, when its other
  // branch is surely killed and its kill reaches the scores' kill through ors only; 0 if none.
  unsigned live_branch(int node);
  // The region nodes (not the score products) the roots read, transitively; a node in `only`
  // is followed into that one operand.
  std::set<int> region_reach(const std::vector<int>& roots,
                             const std::map<int, unsigned>& only) const;
  // The predicate of a select as code, when it reads only positions and scalar inputs.
  std::string pure_predicate(int node) const;
  void mark_live_selects(const value_ref& v, std::map<int, unsigned>& live);

  const graph_view& g_;
  const attention_pattern& p_;
  schema::KernelSpec::Reader spec_;
  std::vector<int> spec_index_;        // graph input -> spec input position
  std::map<int, std::string> size_expr_;
  std::string sizes_code_;
  std::vector<operand_view> q_views_, k_views_, tile_views_, scalar_views_;
  std::vector<std::vector<int>> scalar_c_;
  operand_view v_view_, out_view_;
  std::string functions_, module_code_;
  std::map<std::pair<int, unsigned>, std::string> input_use_;  // (node, operand) -> ix.t/ix.s
  std::map<int, int> term_of_dot_;
  std::map<int, std::string> alias_;   // region nodes emitted as another expression
  std::set<int> impure_;               // region nodes depending on scores or tiles
  std::map<int, std::string> kill_memo_;
  std::set<int> kill_refs_;
  bool has_kill_ = false, kill_static_ = true, kill_rows_ = false, has_live_score_ = false;
  std::vector<int> kill_c_;
  std::vector<std::pair<std::string, std::string>> term_dtypes_;
  std::string v_storage_dtype_;
  int row_align_ = 8;
  int q_item_ = 2, kv_item_ = 2, out_item_ = 2, tile_item_ = 0;
  int score_ops_ = 0;
  bool build_replays(std::string& why);
  bool accounted(std::string& why) const;
  std::string base_expr(const value_ref& base) const;

  bool external_kv_ = false;
  int v_share_ = -1;
  std::set<int> known_;                // nodes accounted for (attention, replays, template)
  std::map<int, std::string> node_base_;  // computed operand bases -> their expressions
  std::string prologue_code_, epilogue_code_, result_ = "out";
  std::vector<std::pair<std::string, axis_indices>> extra_sources_;
  // Per score term: the feature sizes a scale may be derived from (its own head dim, the
  // contraction of the projection computing its query), as (extent, Python expression).
  std::vector<std::vector<std::pair<int64_t, std::string>>> feature_sizes_;
};

// Bytes of one element of a numpy dtype name (bfloat16 -> 2); 4 when unknown.
int attention_dtype_bytes(const std::string& dtype);

}  // namespace maxkernel::agents::expert
