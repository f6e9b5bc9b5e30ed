// Parsing the one YAML document of a spec with yaml-cpp, working around its failure modes:
// YAML::LoadAll loops forever (allocating) on a stray ',' at block level, because each call
// yields another empty document without consuming the token.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace maxkernel::config {

struct yaml_document {
  YAML::Node root;      // valid when error is empty
  std::string error;    // "" on success
  YAML::Mark mark;      // where the error is
};

// Parses `text`, which must hold at most one YAML document.
yaml_document parse_single_document(const std::string& text);

}  // namespace maxkernel::config
