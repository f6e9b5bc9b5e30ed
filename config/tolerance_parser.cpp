#include "config/tolerance_parser.hpp"

#include <fmt/format.h>

#include <limits>

namespace maxkernel::config {

namespace {

double bound(const yaml_mapping& m, const char* key, const std::string& field,
             const field_reader& r) {
  auto e = m.find(key);
  if (!e)
    r.fail(m.mark, child_field(field, key), "missing required field");
  double value = r.number(e->value, child_field(field, key));
  if (value < 0)
    r.fail(e->value, child_field(field, key),
           fmt::format("tolerances must be non-negative, got {}", value));
  return value;
}

}  // namespace

std::vector<output_tolerance> parse_tolerances(const YAML::Node& node, const std::string& field,
                                               const field_reader& r) {
  std::vector<output_tolerance> out;
  if (node.IsMap()) {
    auto m = r.mapping(node, field, {"atol", "rtol"});
    out.push_back({-1, bound(m, "atol", field, r), bound(m, "rtol", field, r)});
    return out;
  }
  if (!node.IsSequence())
    r.fail(node, field,
           fmt::format("expected {{atol: ..., rtol: ...}} or a list of {{output: i, atol: ..., "
                       "rtol: ...}}, got {}",
                       field_reader::describe(node)));
  if (node.size() == 0)
    r.fail(node, field, "the list is empty; give at least one {output: 0, atol: ..., rtol: ...}");
  for (size_t i = 0; i < node.size(); ++i) {
    std::string item = index_field(field, i);
    auto m = r.mapping(node[i], item, {"output", "atol", "rtol"});
    auto index = m.find("output");
    if (!index)
      r.fail(m.mark, child_field(item, "output"), "missing required field (output index)");
    int64_t output = r.integer(index->value, child_field(item, "output"));
    if (output < 0 || output > std::numeric_limits<int32_t>::max())
      r.fail(index->value, child_field(item, "output"),
             fmt::format("output indices start at 0, got {}", output));
    for (const auto& t : out)
      if (t.output == output)
        r.fail(index->value, child_field(item, "output"),
               fmt::format("output {} already has a tolerance", output));
    out.push_back({static_cast<int32_t>(output), bound(m, "atol", item, r),
                   bound(m, "rtol", item, r)});
  }
  return out;
}

}  // namespace maxkernel::config
