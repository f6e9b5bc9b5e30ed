#include "agents/expert/template_registry.hpp"

#include <algorithm>

namespace maxkernel::agents::expert {

// Each family's factory (defined in its own file, agents/expert/<family>_template.cpp).
// Add a family: declare its factory here and list it in all_templates().
template_ptr make_grouped_matmul_template();
template_ptr make_swiglu_mlp_template();
template_ptr make_moe_ffn_template();
template_ptr make_matmul_backward_template();
template_ptr make_attention_backward_template();
template_ptr make_chunked_recurrence_template();
template_ptr make_retention_template();
template_ptr make_topk_template();
template_ptr make_router_template();
template_ptr make_shared_operand_matmul_template();
template_ptr make_conv_gemm_template();
template_ptr make_matmul_template();
template_ptr make_rowwise_template();
template_ptr make_flash_attention_template();
template_ptr make_paged_attention_template();
template_ptr make_ragged_paged_attention_template();
template_ptr make_rope_projection_template();
template_ptr make_einsum_core_template();

const std::vector<template_ptr>& all_templates() {
  static const std::vector<template_ptr> templates = [] {
    std::vector<template_ptr> t;
    t.push_back(make_grouped_matmul_template());
    t.push_back(make_swiglu_mlp_template());
    t.push_back(make_moe_ffn_template());
    t.push_back(make_matmul_backward_template());
    t.push_back(make_attention_backward_template());
    t.push_back(make_chunked_recurrence_template());
    t.push_back(make_retention_template());
    t.push_back(make_router_template());
    t.push_back(make_topk_template());
    t.push_back(make_shared_operand_matmul_template());
    t.push_back(make_conv_gemm_template());
    t.push_back(make_matmul_template());
    t.push_back(make_rowwise_template());
    t.push_back(make_flash_attention_template());
    t.push_back(make_paged_attention_template());
    t.push_back(make_ragged_paged_attention_template());
    t.push_back(make_rope_projection_template());
    t.push_back(make_einsum_core_template());
    return t;
  }();
  return templates;
}

template_ptr find_template(const std::string& name) {
  for (const auto& t : all_templates())
    if (t->name() == name)
      return t;
  return nullptr;
}

std::vector<matched_template> match_templates(const graph_view& graph,
                                              schema::KernelSpec::Reader spec) {
  return match_templates(all_templates(), graph, spec);
}

std::vector<matched_template> match_templates(const std::vector<template_ptr>& templates,
                                              const graph_view& graph,
                                              schema::KernelSpec::Reader spec) {
  std::vector<matched_template> found;
  for (const auto& t : templates)
    if (auto m = t->match(graph, spec))
      found.push_back({t, std::move(*m)});
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.match.score > b.match.score;
  });
  return found;
}

}  // namespace maxkernel::agents::expert
