#include "config/field_reader.hpp"

#include "config/nearest_name.hpp"
#include "config/shown_value.hpp"
#include "config/spec_failure.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace maxkernel::config {

namespace {

bool is_plain(const YAML::Node& node) {
  // yaml-cpp tags plain scalars "?" and quoted ones "!"; explicit core tags pass through.
  const std::string& tag = node.Tag();
  return tag == "?" || tag.empty();
}

std::string shorten(const std::string& s) { return shown_value(s); }

}  // namespace

const yaml_entry* yaml_mapping::find(std::string_view key) const {
  for (const auto& e : entries)
    if (e.key == key)
      return &e;
  return nullptr;
}

void field_reader::fail(const YAML::Mark& mark, const std::string& field,
                        const std::string& message, bool too_large) const {
  spec_failure f;
  f.error.file = file_;
  f.error.line = mark.line >= 0 ? mark.line + 1 : 0;
  f.error.column = mark.line >= 0 && mark.column >= 0 ? mark.column + 1 : 0;
  f.error.field = field;
  f.error.message = message;
  f.error.too_large = too_large;
  throw f;
}

void field_reader::fail(const YAML::Node& at, const std::string& field,
                        const std::string& message) const {
  if (at.IsNull())
    for (const auto& [node, key_mark] : null_value_keys_)
      if (node.is(at))
        fail(key_mark, field, message);
  fail(at.Mark(), field, message);
}

std::string field_reader::describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return "nothing (null)";
    case YAML::NodeType::Scalar: break;
  }
  auto s = resolve_scalar(node.Scalar(), is_plain(node));
  if (s.type == yaml_scalar::kind::null_value)
    return "nothing (null)";
  return fmt::format("{} '{}'", kind_name(s.type), shorten(s.text));
}

yaml_mapping field_reader::mapping(const YAML::Node& node, const std::string& field,
                                   const std::vector<std::string>& allowed) const {
  if (!node.IsMap())
    fail(node, field, fmt::format("expected a mapping (key: value lines), got {}", describe(node)));
  yaml_mapping out;
  out.mark = node.Mark();
  for (auto it = node.begin(); it != node.end(); ++it) {
    // Copies: the iterator's pair is a temporary proxy, a reference into it would dangle.
    YAML::Node key = it->first;
    YAML::Node value = it->second;
    if (!key.IsScalar())
      fail(key, field.empty() ? "(document)" : field,
           fmt::format("keys must be plain names, got {}", describe(key)));
    std::string name = key.Scalar();
    std::string path = child_field(field, name);
    if (out.find(name))
      fail(key, path, "duplicate key");
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      std::string hint = nearest_name(name, allowed);
      fail(key, path,
           fmt::format("unknown key '{}'{}; allowed: {}", shorten(name),
                       hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                       join_names(allowed)));
    }
    if (value.IsNull())
      null_value_keys_.emplace_back(value, key.Mark());
    out.entries.push_back({std::move(name), key, value});
  }
  return out;
}

void field_reader::require_sequence(const YAML::Node& node, const std::string& field,
                                    const char* example) const {
  if (!node.IsSequence())
    fail(node, field, fmt::format("expected a list (like {}), got {}", example, describe(node)));
}

yaml_scalar field_reader::scalar(const YAML::Node& node, const std::string& field) const {
  if (node.IsNull())
    return resolve_scalar("", true);
  if (!node.IsScalar())
    fail(node, field, fmt::format("expected a single value, got {}", describe(node)));
  if (node.Scalar().find('\0') != std::string::npos)
    fail(node, field, "the value contains a NUL character");
  const std::string& tag = node.Tag();
  if (tag == "?" || tag.empty())
    return resolve_scalar(node.Scalar(), true);
  if (tag == "!" || tag == "tag:yaml.org,2002:str")
    return resolve_scalar(node.Scalar(), false);
  if (tag == "tag:yaml.org,2002:int" || tag == "tag:yaml.org,2002:float" ||
      tag == "tag:yaml.org,2002:bool" || tag == "tag:yaml.org,2002:null")
    return resolve_scalar(node.Scalar(), true);
  fail(node, field, fmt::format("unsupported YAML tag '{}'", shorten(tag)));
}

std::string field_reader::text(const YAML::Node& node, const std::string& field) const {
  auto s = scalar(node, field);
  if (s.type == yaml_scalar::kind::null_value)
    fail(node, field, "expected a value, got nothing (null)");
  return s.text;
}

std::string field_reader::string(const YAML::Node& node, const std::string& field) const {
  auto s = scalar(node, field);
  if (s.type != yaml_scalar::kind::string)
    fail(node, field, fmt::format("expected a string, got {}", describe(node)));
  return s.text;
}

int64_t field_reader::integer(const YAML::Node& node, const std::string& field) const {
  auto s = scalar(node, field);
  if (s.type != yaml_scalar::kind::integer)
    fail(node, field, fmt::format("expected an integer, got {}", describe(node)));
  if (s.out_of_range)
    fail(node, field, fmt::format("the integer {} does not fit in 64 bits", shorten(s.text)));
  return s.integer_value;
}

double field_reader::number(const YAML::Node& node, const std::string& field) const {
  auto s = scalar(node, field);
  double value = 0;
  if (s.type == yaml_scalar::kind::integer && !s.out_of_range)
    value = static_cast<double>(s.integer_value);
  else if (s.type == yaml_scalar::kind::floating)
    value = s.float_value;
  else if (s.type == yaml_scalar::kind::integer)
    fail(node, field, fmt::format("the integer {} does not fit in 64 bits", shorten(s.text)));
  else
    fail(node, field, fmt::format("expected a number, got {}", describe(node)));
  if (!std::isfinite(value))
    fail(node, field, fmt::format("expected a finite number, got {}", shorten(s.text)));
  return value;
}

bool field_reader::boolean(const YAML::Node& node, const std::string& field) const {
  auto s = scalar(node, field);
  if (s.type != yaml_scalar::kind::boolean)
    fail(node, field, fmt::format("expected true or false, got {}", describe(node)));
  return s.boolean_value;
}

std::string child_field(const std::string& parent, const std::string& key) {
  // An unknown key may be any scalar, even a multi-line one: keep the path on one short line.
  std::string shown = shorten(key);
  return parent.empty() ? shown : parent + "." + shown;
}

std::string index_field(const std::string& parent, size_t index) {
  return fmt::format("{}[{}]", parent, index);
}

}  // namespace maxkernel::config
