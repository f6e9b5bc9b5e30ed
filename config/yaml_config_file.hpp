// What every small YAML config of the tool (cluster.yaml, workload files) does before its own
// fields: one document, a node budget, and failures reported as spec_failure, rendered as
// "FILE:LINE:COLUMN: field: message". The config's own parser fills its struct.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <optional>
#include <string>

namespace maxkernel::config {

// Throws spec_failure at `mark` (lines and columns from 1).
[[noreturn]] void throw_config_error(const std::string& file, const YAML::Mark& mark,
                                     const std::string& field, const std::string& message);

// Parses `text` (from `file`) and calls `parse` on its root. False with `error` on a YAML
// syntax error, a document past the node budget, or what `parse` throws; `what` names the
// config in an unexpected failure ("the cluster config").
bool parse_config_document(const std::string& text, const std::string& file,
                           const std::string& what,
                           const std::function<void(const YAML::Node&)>& parse,
                           std::string& error);

// The file's text, or nullopt with `error` naming the file.
std::optional<std::string> read_config_file(const std::string& path, std::string& error);

}  // namespace maxkernel::config
