#include "config/native_spec_parser.hpp"

#include "config/chip_names.hpp"
#include "config/contained_path.hpp"
#include "config/dim_expression.hpp"
#include "config/dtype_info.hpp"
#include "config/input_parser.hpp"
#include "config/nearest_name.hpp"
#include "config/python_source.hpp"
#include "config/shown_value.hpp"
#include "config/spec_file.hpp"
#include "config/tolerance_parser.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <optional>

namespace maxkernel::config {

namespace {

const std::vector<std::string> top_level_keys{"name",      "description",    "dims",
                                              "inputs",    "reference",      "reference_file",
                                              "tolerance", "chip",           "baseline"};

constexpr size_t max_inputs = 64;
constexpr size_t max_name_length = 128;

bool is_spec_name(std::string_view s) {
  if (s.empty() || s.size() > max_name_length)
    return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    if (!ok)
      return false;
  }
  return true;
}

uint64_t saturating_mul(uint64_t a, uint64_t b) {
  uint64_t out = 0;
  return __builtin_mul_overflow(a, b, &out) ? std::numeric_limits<uint64_t>::max() : out;
}

uint64_t saturating_add(uint64_t a, uint64_t b) {
  uint64_t out = 0;
  return __builtin_add_overflow(a, b, &out) ? std::numeric_limits<uint64_t>::max() : out;
}

std::string human_bytes(uint64_t bytes) {
  if (bytes == std::numeric_limits<uint64_t>::max())
    return "more than 16 EiB";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6)
    value /= 1024, ++unit;
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, units[unit]);
}

// A dim as written: its node, and for a derived dim the parsed expression.
struct dim_entry {
  YAML::Node value;
  std::optional<dim_expression> expression;
  bool quoted = false;
};

// Where offset `offset` of a dim's expression is in the file. Exact for one-line plain and
// quoted scalars (the quote is one more column); block scalars keep the node's own mark.
YAML::Mark expression_mark(const dim_entry& d, size_t offset) {
  YAML::Mark mark = d.value.Mark();
  const std::string& text = d.value.Scalar();
  if (mark.column >= 0 && text.find('\n') == std::string::npos)
    mark.column += static_cast<int>(offset) + (d.quoted ? 1 : 0);
  return mark;
}

// Derived dims are evaluated in dependency order (a dim may use one declared after it);
// a cycle, an unknown name, a division by zero or a result that is not positive is an error
// at the expression's position.
class dim_resolver {
public:
  dim_resolver(std::vector<named_dim>& dims, const std::vector<dim_entry>& entries,
               const field_reader& r)
      : dims_(dims), entries_(entries), r_(r), state_(dims.size(), 0), depth_(dims.size(), 0) {}

  void resolve_all() {
    for (size_t i = 0; i < dims_.size(); ++i)
      resolve(i);
  }

private:
  // Derived-from-derived levels; bounds the recursion whatever the order of the dims.
  static constexpr size_t max_chain = 64;

  size_t index_of(const std::string& name) const {
    for (size_t i = 0; i < dims_.size(); ++i)
      if (dims_[i].name == name)
        return i;
    return dims_.size();
  }

  void resolve(size_t i) {
    if (state_[i] == 2 || !entries_[i].expression)
      return;
    std::string field = child_field("dims", dims_[i].name);
    const auto& expression = *entries_[i].expression;
    auto too_deep = [&] {
      r_.fail(expression_mark(entries_[i], 0), field,
              fmt::format("derived dims nest more than {} deep", max_chain));
    };
    if (path_.size() >= max_chain)
      too_deep();
    state_[i] = 1;
    path_.push_back(i);
    for (const auto& use : expression.names()) {
      size_t j = index_of(use.name);
      if (j == dims_.size()) {
        std::vector<std::string> names;
        for (const auto& d : dims_)
          if (d.name != dims_[i].name)
            names.push_back(d.name);
        std::string hint = nearest_name(use.name, names);
        r_.fail(expression_mark(entries_[i], use.offset), field,
                fmt::format("unknown dimension '{}'{}; declared: {}", shown_value(use.name),
                            hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                            names.empty() ? "no other dims" : join_names(names)));
      }
      if (j == i)
        r_.fail(expression_mark(entries_[i], use.offset), field,
                fmt::format("'{}' is defined in terms of itself", dims_[i].name));
      if (state_[j] == 1) {
        std::string cycle;
        auto from = std::find(path_.begin(), path_.end(), j);
        for (auto it = from; it != path_.end(); ++it)
          cycle += dims_[*it].name + " -> ";
        r_.fail(expression_mark(entries_[i], use.offset), field,
                fmt::format("the dims depend on each other in a cycle: {}{}", cycle,
                            dims_[j].name));
      }
      resolve(j);
      depth_[i] = std::max(depth_[i], depth_[j] + 1);
    }
    if (depth_[i] == 0)
      depth_[i] = 1;  // derived from literals only
    if (depth_[i] > max_chain)
      too_deep();
    dim_expression_error err;
    auto value = expression.evaluate(
        [&](const std::string& name) { return dims_[index_of(name)].size; }, err);
    std::string inputs;
    for (const auto& use : expression.names())
      inputs += fmt::format("{}{} = {}", inputs.empty() ? " with " : ", ", use.name,
                            dims_[index_of(use.name)].size);
    if (!value)
      r_.fail(expression_mark(entries_[i], err.offset), field,
              fmt::format("{}{}", err.message, inputs));
    if (*value <= 0)
      r_.fail(expression_mark(entries_[i], 0), field,
              fmt::format("'{}' is {}{}; sizes must be positive", shown_value(dims_[i].expression),
                          *value, inputs));
    dims_[i].size = *value;
    path_.pop_back();
    state_[i] = 2;
  }

  std::vector<named_dim>& dims_;
  const std::vector<dim_entry>& entries_;
  const field_reader& r_;
  std::vector<int> state_;  // 0 not visited, 1 being resolved, 2 done
  std::vector<size_t> depth_;  // 0 for a literal size, else 1 + the deepest dim it reads
  std::vector<size_t> path_;
};

std::vector<named_dim> parse_dims(const YAML::Node& node, const field_reader& r) {
  auto m = r.mapping(node, "dims", {});
  std::vector<named_dim> dims;
  std::vector<dim_entry> entries;
  for (const auto& e : m.entries) {
    std::string field = child_field("dims", e.key);
    if (!is_identifier(e.key))
      r.fail(e.key_node, field,
             fmt::format("'{}' is not a valid dimension name (letters, digits and _, not "
                         "starting with a digit)",
                         shown_value(e.key)));
    dim_entry entry{e.value, std::nullopt, false};
    auto s = r.scalar(e.value, field);
    if (s.type == yaml_scalar::kind::integer) {
      int64_t size = r.integer(e.value, field);
      if (size <= 0)
        r.fail(e.value, field, fmt::format("sizes must be positive, got {}", size));
      dims.push_back({e.key, size, ""});
    } else if (s.type == yaml_scalar::kind::string) {
      const std::string& tag = e.value.Tag();
      entry.quoted = !(tag == "?" || tag.empty());
      dim_expression_error err;
      entry.expression = dim_expression::parse(s.text, err);
      if (!entry.expression)
        r.fail(expression_mark(entry, err.offset), field,
               fmt::format("in '{}': {}", shown_value(s.text), err.message));
      // Kept without surrounding blanks: the worker parses it again (as Python).
      size_t first = s.text.find_first_not_of(" \t"), last = s.text.find_last_not_of(" \t");
      dims.push_back({e.key, 0, s.text.substr(first, last - first + 1)});
    } else {
      r.fail(e.value, field,
             fmt::format("expected a positive integer or an integer expression over other "
                         "dims (like MAX_SEQS + 1), got {}",
                         field_reader::describe(e.value)));
    }
    entries.push_back(std::move(entry));
  }
  dim_resolver(dims, entries, r).resolve_all();
  return dims;
}

std::string read_reference_file(const yaml_entry& e, const spec_parse_context& ctx,
                                const field_reader& r) {
  std::string value = r.string(e.value, "reference_file");
  auto resolved = resolve_contained_file(ctx.spec_dir, value);
  if (!resolved.error.empty())
    r.fail(e.value, "reference_file", resolved.error);
  spec_error file_err;
  auto text = read_text_file(resolved.path.string(), file_err);
  if (!text) {
    std::string where = file_err.line > 0 ? fmt::format(" (line {}, column {})", file_err.line,
                                                        file_err.column)
                                          : "";
    r.fail(e.value, "reference_file",
           fmt::format("{}{}: {}", shown_value(value), where, file_err.message));
  }
  if (!defines_function(*text, "reference"))
    r.fail(e.value, "reference_file",
           fmt::format("{} does not define `def reference(...)` at module level",
                       shown_value(value)));
  return *text;
}

void check_memory(const native_spec& spec, const YAML::Node& inputs_node,
                  const spec_parse_context& ctx, const field_reader& r) {
  uint64_t total = 0;
  size_t largest = 0;
  uint64_t largest_bytes = 0;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    uint64_t bytes = input_bytes(spec.inputs[i]);
    total = saturating_add(total, bytes);
    if (bytes > largest_bytes)
      largest = i, largest_bytes = bytes;
  }
  // A saturated total means "more than 2^64 bytes": too large whatever the limit.
  if (total <= ctx.memory_limit_bytes && total != std::numeric_limits<uint64_t>::max())
    return;
  r.fail(inputs_node.Mark(), "inputs",
         fmt::format("the inputs need {} ({} bytes), more than the memory limit of {}; the "
                     "largest is inputs[{}] '{}' with {}",
                     human_bytes(total),
                     total == std::numeric_limits<uint64_t>::max() ? "> 2^64"
                                                                   : std::to_string(total),
                     human_bytes(ctx.memory_limit_bytes), largest, spec.inputs[largest].name,
                     human_bytes(largest_bytes)),
         /*too_large=*/true);
}

}  // namespace

uint64_t input_bytes(const native_input& input) {
  if (input.is_static)
    return 0;
  auto dtype = find_dtype(input.dtype);
  uint64_t bytes = dtype ? dtype->itemsize : 1;
  for (int64_t size : input.shape)
    bytes = saturating_mul(bytes, static_cast<uint64_t>(size));
  return bytes;
}

native_spec parse_native_spec(const YAML::Node& root, const spec_parse_context& ctx,
                              const field_reader& r) {
  if (root.IsNull())
    r.fail(YAML::Mark{}, "(document)", "the spec is empty");
  if (!root.IsMap())
    r.fail(root, "(document)",
           fmt::format("the top level of a spec must be a mapping (name:, inputs:, "
                       "reference:, ...), got {}",
                       field_reader::describe(root)));
  auto m = r.mapping(root, "", top_level_keys);
  native_spec spec;
  spec.source_path = ctx.source_path;

  auto name = m.find("name");
  if (!name)
    r.fail(m.mark, "name", "missing required field");
  spec.name = r.text(name->value, "name");
  if (!is_spec_name(spec.name))
    r.fail(name->value, "name",
           fmt::format("'{}' is not a valid task name: use letters, digits, '_', '.' and '-' "
                       "(at most {} characters)",
                       shown_value(spec.name), max_name_length));

  if (auto e = m.find("description"))
    spec.description = r.text(e->value, "description");

  if (auto e = m.find("dims"))
    spec.dims = parse_dims(e->value, r);

  auto inputs = m.find("inputs");
  if (!inputs)
    r.fail(m.mark, "inputs", "missing required field");
  r.require_sequence(inputs->value, "inputs", "[{name: x, shape: [M, K], dtype: bfloat16}]");
  if (inputs->value.size() == 0)
    r.fail(inputs->value, "inputs", "the reference needs at least one input");
  if (inputs->value.size() > max_inputs)
    r.fail(inputs->value, "inputs",
           fmt::format("{} inputs; the limit is {}", inputs->value.size(), max_inputs));
  for (size_t i = 0; i < inputs->value.size(); ++i) {
    const YAML::Node item = inputs->value[i];
    std::string field = index_field("inputs", i);
    auto input = parse_input(item, field, spec.dims, r);
    for (size_t j = 0; j < spec.inputs.size(); ++j)
      if (spec.inputs[j].name == input.name)
        r.fail(item, child_field(field, "name"),
               fmt::format("duplicate input name '{}' (also inputs[{}])", input.name, j));
    spec.inputs.push_back(std::move(input));
  }

  auto reference = m.find("reference");
  auto reference_file = m.find("reference_file");
  if (reference && reference_file)
    r.fail(reference_file->key_node, "reference_file",
           "give either `reference` (inline source) or `reference_file`, not both");
  if (!reference && !reference_file)
    r.fail(m.mark, "reference",
           "missing required field: inline Python defining `reference(...)`, or "
           "`reference_file: ref.py`");
  if (reference) {
    spec.reference = r.string(reference->value, "reference");
    if (!defines_function(spec.reference, "reference"))
      r.fail(reference->value, "reference",
             "the source does not define `def reference(...)` at module level");
  } else {
    spec.reference = read_reference_file(*reference_file, ctx, r);
  }

  if (auto e = m.find("tolerance"))
    spec.tolerances = parse_tolerances(e->value, "tolerance", r);
  else
    spec.tolerances.push_back({-1, 1e-2, 1e-2});  // JAXBench's harness default

  if (auto e = m.find("chip")) {
    spec.chip = r.string(e->value, "chip");
    if (!is_known_chip(spec.chip)) {
      std::string hint = nearest_name(spec.chip, chip_names());
      r.fail(e->value, "chip",
             fmt::format("unknown chip '{}'{}; expected one of {}", shown_value(spec.chip),
                         hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                         join_names(chip_names())));
    }
  }
  if (!ctx.chip_override.empty())
    spec.chip = ctx.chip_override;

  if (auto e = m.find("baseline")) {
    std::string value = r.string(e->value, "baseline");
    auto resolved = resolve_contained_file(ctx.spec_dir, value);
    if (!resolved.error.empty())
      r.fail(e->value, "baseline", resolved.error);
    spec.baseline_path = resolved.path.string();
  }

  check_memory(spec, inputs->value, ctx, r);
  return spec;
}

}  // namespace maxkernel::config
