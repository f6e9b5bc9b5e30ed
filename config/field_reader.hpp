// Typed access to yaml-cpp nodes that turns every mismatch into a spec_failure naming the
// file, the line and column of the node, and the field path.
#pragma once

#include "config/yaml_scalar.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

namespace maxkernel::config {

struct yaml_entry {
  std::string key;
  YAML::Node key_node;
  YAML::Node value;
};

// The entries of a mapping, in document order, with unique scalar keys.
struct yaml_mapping {
  YAML::Mark mark;
  std::vector<yaml_entry> entries;

  const yaml_entry* find(std::string_view key) const;
};

class field_reader {
public:
  explicit field_reader(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }

  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& field,
                         const std::string& message, bool too_large = false) const;
  [[noreturn]] void fail(const YAML::Node& at, const std::string& field,
                         const std::string& message) const;

  // Refuses anything but a mapping whose keys are distinct scalars from `allowed`.
  yaml_mapping mapping(const YAML::Node& node, const std::string& field,
                       const std::vector<std::string>& allowed) const;
  // Refuses anything but a sequence.
  void require_sequence(const YAML::Node& node, const std::string& field,
                        const char* example) const;

  yaml_scalar scalar(const YAML::Node& node, const std::string& field) const;
  std::string text(const YAML::Node& node, const std::string& field) const;  // any scalar
  std::string string(const YAML::Node& node, const std::string& field) const;  // not a number
  int64_t integer(const YAML::Node& node, const std::string& field) const;
  double number(const YAML::Node& node, const std::string& field) const;  // finite int or float
  bool boolean(const YAML::Node& node, const std::string& field) const;

  // "a list", "the float 1.5", ... for messages.
  static std::string describe(const YAML::Node& node);

private:
  std::string file_;
  // yaml-cpp marks an empty value (`chip:`) at the next token, often the next line; errors
  // about such a value point at its key instead.
  mutable std::vector<std::pair<YAML::Node, YAML::Mark>> null_value_keys_;
};

// A key's path below its parent: "inputs" / "inputs[1].dtype".
std::string child_field(const std::string& parent, const std::string& key);
std::string index_field(const std::string& parent, size_t index);

}  // namespace maxkernel::config
