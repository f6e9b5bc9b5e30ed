#include "config/generator_parser.hpp"

#include "config/nearest_name.hpp"
#include "config/python_source.hpp"
#include "config/shown_value.hpp"

#include <fmt/format.h>

namespace maxkernel::config {

namespace {

const std::vector<std::string> kinds{"normal", "uniform", "randint", "zeros", "ones", "code"};

std::string kind_list() { return join_names(kinds); }

void check_kind_fits_dtype(const std::string& kind, const YAML::Node& at, const std::string& field,
                           const dtype_info& dtype, const field_reader& r) {
  bool floating_kind = kind == "normal" || kind == "uniform";
  if (floating_kind && !dtype.is_float)
    r.fail(at, field,
           fmt::format("{} draws floating-point values and the input is {}; use randint, zeros, "
                       "ones or code",
                       kind, dtype.name));
  if (kind == "randint" && dtype.is_float)
    r.fail(at, field,
           fmt::format("randint is for integer and bool inputs and the input is {}; use normal "
                       "or uniform",
                       dtype.name));
}

input_generator parse_params(const std::string& kind, const YAML::Node& at,
                             const YAML::Node& params, const std::string& field,
                             const dtype_info& dtype, const field_reader& r) {
  check_kind_fits_dtype(kind, at, field, dtype, r);
  bool empty = params.IsNull() || (params.IsMap() && params.size() == 0);
  if (kind == "zeros" || kind == "ones") {
    if (!empty)
      r.fail(params, field, fmt::format("{} takes no parameters, got {}", kind,
                                        field_reader::describe(params)));
    if (kind == "zeros")
      return zeros_generator{};
    return ones_generator{};
  }
  if (kind == "code") {
    if (!params.IsScalar())
      r.fail(params.IsNull() ? at : params, field,
             "expected Python source defining generate(rng, shape, dtype, dims), got " +
                 field_reader::describe(params));
    std::string source = r.string(params, field);
    if (!defines_function(source, "generate"))
      r.fail(params, field,
             "the code does not define `def generate(rng, shape, dtype, dims)` at module level");
    return code_generator{std::move(source)};
  }
  if (kind == "normal") {
    normal_generator g;
    if (empty)
      return g;
    auto m = r.mapping(params, field, {"mean", "std"});
    if (auto e = m.find("mean"))
      g.mean = r.number(e->value, child_field(field, "mean"));
    if (auto e = m.find("std")) {
      g.std = r.number(e->value, child_field(field, "std"));
      if (!(g.std > 0))
        r.fail(e->value, child_field(field, "std"),
               fmt::format("std must be positive, got {}", g.std));
    }
    return g;
  }
  if (kind == "uniform") {
    uniform_generator g;
    if (empty)
      return g;
    auto m = r.mapping(params, field, {"low", "high"});
    if (auto e = m.find("low"))
      g.low = r.number(e->value, child_field(field, "low"));
    if (auto e = m.find("high"))
      g.high = r.number(e->value, child_field(field, "high"));
    if (!(g.low < g.high)) {
      auto e = m.find("high") ? m.find("high") : m.find("low");
      r.fail(e->value, child_field(field, e->key),
             fmt::format("low must be below high, got low {} and high {}", g.low, g.high));
    }
    return g;
  }
  // randint: integer bounds, high exclusive, within the dtype's range.
  randint_generator g;
  if (params.IsNull())
    r.fail(at, child_field(field, "high"), "randint needs `high` (exclusive), e.g. {low: 0, high: 16}");
  auto m = r.mapping(params, field, {"low", "high"});
  auto bound = [&](const yaml_entry& e) {
    auto s = r.scalar(e.value, child_field(field, e.key));
    if (s.type != yaml_scalar::kind::integer)
      r.fail(e.value, child_field(field, e.key),
             fmt::format("randint bounds must be integers, got {}", field_reader::describe(e.value)));
    return r.integer(e.value, child_field(field, e.key));
  };
  if (auto e = m.find("low"))
    g.low = bound(*e);
  auto high = m.find("high");
  if (!high)
    r.fail(m.mark, child_field(field, "high"), "missing required field (exclusive upper bound)");
  g.high = bound(*high);
  if (g.low >= g.high)
    r.fail(high->value, child_field(field, "high"),
           fmt::format("low must be below high (high is exclusive), got low {} and high {}", g.low,
                       g.high));
  // high is exclusive: the largest value drawn is high - 1 (no overflow: high > low).
  if (g.low < dtype.min || g.high - 1 > dtype.max) {
    auto e = g.low < dtype.min ? m.find("low") : high;
    r.fail(e->value, child_field(field, e->key),
           fmt::format("[{}, {}) does not fit in {} (values {} to {})", g.low, g.high, dtype.name,
                       dtype.min, dtype.max));
  }
  return g;
}

}  // namespace

input_generator parse_generator(const YAML::Node* node, const YAML::Mark& input_mark,
                                const std::string& field, const dtype_info& dtype,
                                const field_reader& r) {
  if (!node) {
    if (dtype.is_float)
      return normal_generator{};
    r.fail(input_mark, field,
           fmt::format("missing required field: {} inputs have no default generator; use "
                       "randint, zeros, ones or code",
                       dtype.name));
  }
  if (node->IsScalar()) {
    // A bare kind name: `generator: zeros`, `generator: normal` (its defaults).
    std::string kind = r.string(*node, field);
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
      std::string hint = nearest_name(kind, kinds);
      r.fail(*node, field,
             fmt::format("unknown generator '{}'{}; expected one of {}", shown_value(kind),
                         hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                         kind_list()));
    }
    return parse_params(kind, *node, YAML::Node(YAML::NodeType::Null), field, dtype, r);
  }
  if (!node->IsMap())
    r.fail(*node, field,
           fmt::format("expected a generator such as {{normal: {{mean: 0, std: 1}}}}, got {}",
                       field_reader::describe(*node)));
  auto m = r.mapping(*node, field, kinds);
  if (m.entries.empty())
    r.fail(*node, field, "choose one generator: " + kind_list());
  if (m.entries.size() > 1)
    r.fail(m.entries[1].key_node, field,
           fmt::format("exactly one generator kind, got {} and {}", m.entries[0].key,
                       m.entries[1].key));
  const auto& e = m.entries[0];
  return parse_params(e.key, e.key_node, e.value, child_field(field, e.key), dtype, r);
}

}  // namespace maxkernel::config
