// Every template family of the expert brain, and matching a reference against all of them.
#pragma once

#include "agents/expert/kernel_template.hpp"

#include <vector>

namespace maxkernel::agents::expert {

const std::vector<template_ptr>& all_templates();

// nullptr when no template has this name.
template_ptr find_template(const std::string& name);

struct matched_template {
  template_ptr tmpl;
  template_match match;
};

// Every template of `templates` that matches, best score first (ties: list order).
std::vector<matched_template> match_templates(const std::vector<template_ptr>& templates,
                                              const graph_view& graph,
                                              schema::KernelSpec::Reader spec);
// Over all_templates().
std::vector<matched_template> match_templates(const graph_view& graph,
                                              schema::KernelSpec::Reader spec);

}  // namespace maxkernel::agents::expert
