#include "config/input_parser.hpp"

#include "config/dtype_info.hpp"
#include "config/generator_parser.hpp"
#include "config/nearest_name.hpp"
#include "config/shown_value.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace maxkernel::config {

namespace {

const std::vector<std::string> input_keys{"name", "shape", "dtype", "generator", "structural",
                                          "static"};

std::string static_json(const YAML::Node& node, const std::string& field, const field_reader& r) {
  if (!node.IsScalar() && !node.IsNull())
    r.fail(node, field,
           fmt::format("a static argument is one int, float, bool or string, got {}",
                       field_reader::describe(node)));
  auto s = r.scalar(node, field);
  nlohmann::json value;
  switch (s.type) {
    case yaml_scalar::kind::null_value: value = nullptr; break;
    case yaml_scalar::kind::boolean: value = s.boolean_value; break;
    case yaml_scalar::kind::integer:
      value = r.integer(node, field);
      break;
    case yaml_scalar::kind::floating:
      if (!std::isfinite(s.float_value))
        r.fail(node, field,
               fmt::format("{} has no JSON form; pass it as a string", shown_value(s.text)));
      value = s.float_value;
      break;
    case yaml_scalar::kind::string: value = s.text; break;
  }
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void parse_shape(const YAML::Node& node, const std::string& field,
                 const std::vector<named_dim>& dims, const field_reader& r, native_input& in) {
  r.require_sequence(node, field, "[M, K] or [128, 256]");
  if (node.size() > max_rank)
    r.fail(node, field, fmt::format("rank {} is above the limit of {}", node.size(), max_rank));
  std::vector<std::string> dim_names;
  for (const auto& d : dims)
    dim_names.push_back(d.name);
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node axis = node[i];
    std::string axis_field = index_field(field, i);
    auto s = r.scalar(axis, axis_field);
    if (s.type == yaml_scalar::kind::integer) {
      int64_t size = r.integer(axis, axis_field);
      if (size <= 0)
        r.fail(axis, axis_field, fmt::format("sizes must be positive, got {}", size));
      in.shape.push_back(size);
      in.dim_names.emplace_back();
    } else if (s.type == yaml_scalar::kind::string) {
      auto it = std::find_if(dims.begin(), dims.end(),
                             [&](const named_dim& d) { return d.name == s.text; });
      if (it == dims.end()) {
        std::string hint = nearest_name(s.text, dim_names);
        r.fail(axis, axis_field,
               fmt::format("unknown dimension '{}'{}; {}", shown_value(s.text),
                           hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                           dims.empty() ? "the spec declares no dims"
                                        : "declared: " + join_names(dim_names)));
      }
      in.shape.push_back(it->size);
      in.dim_names.push_back(it->name);
    } else {
      r.fail(axis, axis_field,
             fmt::format("expected an integer size or a dimension name, got {}",
                         field_reader::describe(axis)));
    }
  }
}

}  // namespace

bool is_identifier(std::string_view name) {
  if (name.empty() || name.size() > 128)
    return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok)
      return false;
  }
  return true;
}

native_input parse_input(const YAML::Node& node, const std::string& field,
                         const std::vector<named_dim>& dims, const field_reader& r) {
  auto m = r.mapping(node, field, input_keys);
  native_input in;
  auto name = m.find("name");
  if (!name)
    r.fail(m.mark, child_field(field, "name"), "missing required field");
  in.name = r.text(name->value, child_field(field, "name"));
  if (!is_identifier(in.name))
    r.fail(name->value, child_field(field, "name"),
           fmt::format("'{}' is not a valid parameter name (letters, digits and _, not starting "
                       "with a digit)",
                       shown_value(in.name)));

  if (auto st = m.find("static")) {
    for (const char* other : {"shape", "dtype", "generator", "structural"})
      if (auto e = m.find(other))
        r.fail(e->key_node, child_field(field, other),
               "a static argument takes only `name` and `static`");
    in.is_static = true;
    in.static_json = static_json(st->value, child_field(field, "static"), r);
    in.generator = zeros_generator{};  // unused for static arguments
    return in;
  }

  auto shape = m.find("shape");
  if (!shape)
    r.fail(m.mark, child_field(field, "shape"),
           "missing required field (use [] for a 0-d array, or `static:` for a Python scalar)");
  parse_shape(shape->value, child_field(field, "shape"), dims, r, in);

  auto dtype_entry = m.find("dtype");
  if (!dtype_entry)
    r.fail(m.mark, child_field(field, "dtype"), "missing required field");
  std::string dtype_field = child_field(field, "dtype");
  in.dtype = r.string(dtype_entry->value, dtype_field);
  auto dtype = find_dtype(in.dtype);
  if (!dtype) {
    std::string hint = nearest_name(in.dtype, dtype_names());
    r.fail(dtype_entry->value, dtype_field,
           fmt::format("unknown dtype '{}'{}; expected one of {}", shown_value(in.dtype),
                       hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                       join_names(dtype_names())));
  }

  auto gen = m.find("generator");
  in.generator = parse_generator(gen ? &gen->value : nullptr, m.mark,
                                 child_field(field, "generator"), *dtype, r);

  if (auto e = m.find("structural")) {
    in.structural = r.boolean(e->value, child_field(field, "structural"));
    if (in.structural && !dtype->is_integer())
      r.fail(e->value, child_field(field, "structural"),
             fmt::format("structural inputs (page tables, group sizes) are integers; this one "
                         "is {}",
                         in.dtype));
  }
  return in;
}

}  // namespace maxkernel::config
