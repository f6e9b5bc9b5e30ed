#include "config/chip_loader.hpp"

#include "config/chip_names.hpp"
#include "config/field_reader.hpp"
#include "config/nearest_name.hpp"
#include "config/node_budget.hpp"
#include "config/shown_value.hpp"
#include "config/spec_failure.hpp"
#include "config/spec_file.hpp"
#include "config/utf8_check.hpp"
#include "config/yaml_document.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <utility>
#include <variant>
#include <vector>

namespace maxkernel::config {

namespace fs = std::filesystem;

namespace {

constexpr const char* document_field = "(document)";
constexpr const char* efficiency_key = "efficiency";
constexpr std::string_view note_prefix = "# calibrate: ";

// ---- The fields of a chip file ------------------------------------------------------------

enum class value_kind {
  count,         // unsigned integer >= 1
  count_or_zero, // unsigned integer >= 0
  flag,          // true / false
  rate,          // finite number > 0
  rate_or_zero,  // finite number >= 0 (0: not supported)
  bytes,         // integer > 0
};

struct top_field {
  const char* key;
  value_kind kind;
  std::variant<unsigned chip::*, bool chip::*, double chip::*, uint64_t chip::*> member;
};

// In the order of config::chip; `name` and `efficiency` are read on their own.
const std::vector<top_field>& top_fields() {
  static const std::vector<top_field> fields{
      {"devices_per_chip", value_kind::count, &chip::devices_per_chip},
      {"cores_per_device", value_kind::count, &chip::cores_per_device},
      {"megacore", value_kind::flag, &chip::megacore},
      {"mxus_per_core", value_kind::count, &chip::mxus_per_core},
      {"mxu_size", value_kind::count, &chip::mxu_size},
      {"clock_hz", value_kind::rate, &chip::clock_hz},
      {"bf16_flops", value_kind::rate, &chip::bf16_flops},
      {"int8_ops", value_kind::rate_or_zero, &chip::int8_ops},
      {"fp8_flops", value_kind::rate_or_zero, &chip::fp8_flops},
      {"vpu_flops", value_kind::rate, &chip::vpu_flops},
      {"transcendentals", value_kind::rate, &chip::transcendentals},
      {"hbm_bytes", value_kind::bytes, &chip::hbm_bytes},
      {"hbm_bandwidth", value_kind::rate, &chip::hbm_bandwidth},
      {"vmem_bytes", value_kind::bytes, &chip::vmem_bytes},
      {"scoped_vmem_bytes", value_kind::bytes, &chip::scoped_vmem_bytes},
      {"smem_bytes", value_kind::bytes, &chip::smem_bytes},
      {"sublanes", value_kind::count, &chip::sublanes},
      {"lanes", value_kind::count, &chip::lanes},
      {"packed_sublane_tiling", value_kind::flag, &chip::packed_sublane_tiling},
      {"ici_link_bandwidth", value_kind::rate_or_zero, &chip::ici_link_bandwidth},
      {"ici_links", value_kind::count_or_zero, &chip::ici_links},
  };
  return fields;
}

enum class efficiency_kind {
  fraction,  // a share of a peak: (0, 1]
  time_us,   // a fixed cost in microseconds: >= 0
  passes,    // bf16 passes per f32 dot: >= 1
  overlap,   // a share of work hidden under other work: [0, 1]
};

struct efficiency_field {
  const char* key;
  efficiency_kind kind;
  double chip_efficiency::*member;
};

const std::vector<efficiency_field>& efficiency_fields() {
  static const std::vector<efficiency_field> fields{
      {"mxu", efficiency_kind::fraction, &chip_efficiency::mxu},
      {"vpu", efficiency_kind::fraction, &chip_efficiency::vpu},
      {"hbm", efficiency_kind::fraction, &chip_efficiency::hbm},
      {"dma_latency_us", efficiency_kind::time_us, &chip_efficiency::dma_latency_us},
      {"step_overhead_us", efficiency_kind::time_us, &chip_efficiency::step_overhead_us},
      {"kernel_launch_us", efficiency_kind::time_us, &chip_efficiency::kernel_launch_us},
      {"xla_mxu", efficiency_kind::fraction, &chip_efficiency::xla_mxu},
      {"xla_hbm", efficiency_kind::fraction, &chip_efficiency::xla_hbm},
      {"xla_fusion_us", efficiency_kind::time_us, &chip_efficiency::xla_fusion_us},
      {"f32_matmul_passes", efficiency_kind::passes, &chip_efficiency::f32_matmul_passes},
      {"slot_overlap", efficiency_kind::overlap, &chip_efficiency::slot_overlap},
  };
  return fields;
}

std::vector<std::string> top_level_keys() {
  std::vector<std::string> keys{"name"};
  for (const auto& f : top_fields())
    keys.emplace_back(f.key);
  keys.emplace_back(efficiency_key);
  return keys;
}

std::vector<std::string> efficiency_keys() {
  std::vector<std::string> keys;
  for (const auto& f : efficiency_fields())
    keys.emplace_back(f.key);
  return keys;
}

// "" when `value` is acceptable for an efficiency constant of this kind.
std::string efficiency_problem(efficiency_kind kind, double value) {
  if (!std::isfinite(value))
    return fmt::format("expected a finite number, got {}", value);
  switch (kind) {
    case efficiency_kind::fraction:
      if (value <= 0 || value > 1)
        return fmt::format("a share of the peak must be in (0, 1], got {}", value);
      break;
    case efficiency_kind::time_us:
      if (value < 0)
        return fmt::format("a time in microseconds must be >= 0, got {}", value);
      break;
    case efficiency_kind::passes:
      if (value < 1)
        return fmt::format("an f32 dot takes at least 1 bf16 pass, got {}", value);
      break;
    case efficiency_kind::overlap:
      if (value < 0 || value > 1)
        return fmt::format("an overlap share must be in [0, 1], got {}", value);
      break;
  }
  return {};
}

// ---- Reading ------------------------------------------------------------------------------

const yaml_entry& require(const yaml_mapping& m, const std::string& key, const std::string& parent,
                          const field_reader& r) {
  if (const yaml_entry* e = m.find(key))
    return *e;
  r.fail(m.mark, child_field(parent, key),
         fmt::format("missing field '{}'; a chip file sets every field (docs/chips.md)", key));
}

unsigned read_unsigned(const field_reader& r, const YAML::Node& n, const std::string& field,
                       int64_t min) {
  int64_t v = r.integer(n, field);
  if (v < min)
    r.fail(n, field,
           min == 1 ? fmt::format("expected a positive integer, got {}", v)
                    : fmt::format("expected an integer >= 0, got {}", v));
  if (v > std::numeric_limits<unsigned>::max())
    r.fail(n, field, fmt::format("{} is too large", v));
  return static_cast<unsigned>(v);
}

double read_rate(const field_reader& r, const YAML::Node& n, const std::string& field,
                 bool zero_allowed) {
  double v = r.number(n, field);
  if (zero_allowed ? v < 0 : v <= 0)
    r.fail(n, field,
           fmt::format("expected {}, got {}",
                       zero_allowed ? "a number >= 0 (0: not supported)" : "a positive number",
                       shown_value(r.text(n, field))));
  return v;
}

uint64_t read_bytes(const field_reader& r, const YAML::Node& n, const std::string& field) {
  auto s = r.scalar(n, field);
  if (s.type != yaml_scalar::kind::integer && n.IsScalar())
    r.fail(n, field,
           fmt::format("sizes are whole bytes (like 134217728 for 128 MiB), got {}",
                       field_reader::describe(n)));
  int64_t v = r.integer(n, field);
  if (v <= 0)
    r.fail(n, field, fmt::format("expected a positive number of bytes, got {}", v));
  return static_cast<uint64_t>(v);
}

void read_top_field(const field_reader& r, const yaml_entry& e, const top_field& f, chip& c) {
  const std::string field = f.key;
  switch (f.kind) {
    case value_kind::count:
    case value_kind::count_or_zero:
      c.*std::get<unsigned chip::*>(f.member) =
          read_unsigned(r, e.value, field, f.kind == value_kind::count ? 1 : 0);
      break;
    case value_kind::flag:
      c.*std::get<bool chip::*>(f.member) = r.boolean(e.value, field);
      break;
    case value_kind::rate:
    case value_kind::rate_or_zero:
      c.*std::get<double chip::*>(f.member) =
          read_rate(r, e.value, field, f.kind == value_kind::rate_or_zero);
      break;
    case value_kind::bytes:
      c.*std::get<uint64_t chip::*>(f.member) = read_bytes(r, e.value, field);
      break;
  }
}

chip_efficiency read_efficiency(const field_reader& r, const yaml_entry& entry) {
  auto m = r.mapping(entry.value, efficiency_key, efficiency_keys());
  chip_efficiency out;
  for (const auto& f : efficiency_fields()) {
    const yaml_entry& e = require(m, f.key, efficiency_key, r);
    std::string field = child_field(efficiency_key, f.key);
    double v = r.number(e.value, field);
    if (auto problem = efficiency_problem(f.kind, v); !problem.empty())
      r.fail(e.value, field, problem);
    out.*f.member = v;
  }
  return out;
}

// Every field but the file-name check; throws spec_failure.
chip parse_chip(const YAML::Node& root, const field_reader& r) {
  if (!root.IsDefined() || root.IsNull())
    r.fail(YAML::Mark{}, document_field, "the chip file is empty");
  if (!root.IsMap())
    r.fail(root, document_field,
           fmt::format("a chip file is a mapping of fields (name: v6e, ...), got {}",
                       field_reader::describe(root)));
  auto m = r.mapping(root, "", top_level_keys());

  chip c;
  const yaml_entry& name = require(m, "name", "", r);
  c.name = r.string(name.value, "name");
  if (!is_chip_name(c.name))
    r.fail(name.value, "name",
           fmt::format("'{}' is not a chip name (letters, digits, '_', '-', '.')",
                       shown_value(c.name)));
  for (const auto& f : top_fields())
    read_top_field(r, require(m, f.key, "", r), f, c);
  c.efficiency = read_efficiency(r, require(m, efficiency_key, "", r));

  // Consistency between fields; each error points at the field that has to change.
  if (c.scoped_vmem_bytes > c.vmem_bytes)
    r.fail(m.find("scoped_vmem_bytes")->value, "scoped_vmem_bytes",
           fmt::format("the scoped VMEM limit ({} bytes) exceeds the VMEM of a core "
                       "(vmem_bytes: {})",
                       c.scoped_vmem_bytes, c.vmem_bytes));
  if (c.megacore != (c.cores_per_device > 1))
    r.fail(m.find("megacore")->value, "megacore",
           fmt::format("megacore is {} but cores_per_device is {}; megacore means a device "
                       "has more than one TensorCore",
                       c.megacore, c.cores_per_device));
  if ((c.ici_links == 0) != (c.ici_link_bandwidth == 0))
    r.fail(m.find("ici_link_bandwidth")->value, "ici_link_bandwidth",
           fmt::format("ici_link_bandwidth is {} with {} ici_links; both are 0 (no "
                       "interconnect) or both positive",
                       c.ici_link_bandwidth, c.ici_links));
  return c;
}

spec_error make_error(const std::string& file, int line, int column, std::string field,
                      std::string message) {
  spec_error e;
  e.file = file;
  e.line = line;
  e.column = column;
  e.field = std::move(field);
  e.message = std::move(message);
  return e;
}

spec_error position_error(const std::string& file, const YAML::Mark& mark, std::string field,
                          std::string message) {
  int line = mark.line >= 0 ? mark.line + 1 : 1;
  int column = mark.line >= 0 && mark.column >= 0 ? mark.column + 1 : 1;
  return make_error(file, line, column, std::move(field), std::move(message));
}

// Parses a whole chip document; `file` only labels errors. Throws spec_failure.
chip parse_chip_text(const std::string& text, const std::string& file, YAML::Node* root_out) {
  auto document = parse_single_document(text);
  if (!document.error.empty()) {
    spec_failure f;
    f.error = position_error(file, document.mark, document_field, document.error);
    throw f;
  }
  auto budget = check_node_budget(document.root);
  if (!budget.ok) {
    spec_failure f;
    f.error = position_error(file, budget.mark, budget.field, budget.message);
    throw f;
  }
  field_reader reader(file);
  chip c = parse_chip(document.root, reader);
  if (root_out)
    *root_out = document.root;
  return c;
}

bool load(const std::string& path, chip& out, spec_error& error) {
  spec_error file_error;
  auto text = read_text_file(path, file_error);
  if (!text) {
    error = make_error(path, file_error.line, file_error.column, document_field,
                       file_error.message);
    return false;
  }
  YAML::Node root;
  chip c = parse_chip_text(*text, path, &root);
  std::string stem = fs::path(path).stem().string();
  if (c.name != stem) {
    field_reader reader(path);
    const YAML::Node& const_root = root;
    reader.fail(const_root["name"], "name",
                fmt::format("the chip is named '{}' but its file is '{}'; a chip file is "
                            "named after its chip ({}.yaml)",
                            shown_value(c.name), shown_value(fs::path(path).filename().string()),
                            shown_value(c.name)));
  }
  c.source_path = path;
  out = std::move(c);
  return true;
}

// ---- Rewriting the efficiency block -------------------------------------------------------

std::string format_number(double v) {
  // fmt's shortest representation reads back as the same double.
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";  // keep a float a float in the file
  return s;
}

struct replacement {
  size_t pos = 0;
  size_t length = 0;
  std::string text;
};

size_t start_of_line(const std::string& text, size_t pos) {
  if (pos == 0)
    return 0;
  size_t newline = text.rfind('\n', pos - 1);
  return newline == std::string::npos ? 0 : newline + 1;
}

std::vector<std::string> note_lines(std::string_view note) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= note.size()) {
    size_t end = note.find('\n', start);
    if (end == std::string_view::npos)
      end = note.size();
    std::string line(note.substr(start, end - start));
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  while (!lines.empty() && lines.back().empty())
    lines.pop_back();
  return lines;
}

std::string rewrite(const std::string& text, const chip_efficiency& fitted, std::string_view note,
                    std::string& error) {
  YAML::Node root;
  try {
    parse_chip_text(text, "(chip file)", &root);
  } catch (const spec_failure& f) {
    error = "the original chip file is not valid: " + f.error.what();
    return {};
  }

  for (const auto& f : efficiency_fields())
    if (auto problem = efficiency_problem(f.kind, fitted.*f.member); !problem.empty()) {
      error = fmt::format("fitted efficiency.{}: {}", f.key, problem);
      return {};
    }
  if (auto problem = find_invalid_text(note)) {
    error = "the note: " + problem->message;
    return {};
  }

  // The efficiency key (for the note) and each value's place in the text.
  YAML::Node key_node;
  YAML::Node block;
  for (auto it = root.begin(); it != root.end(); ++it)
    if (it->first.Scalar() == efficiency_key) {
      key_node = it->first;
      block = it->second;
    }
  std::vector<replacement> edits;
  for (auto it = block.begin(); it != block.end(); ++it) {
    YAML::Node key = it->first;
    YAML::Node value = it->second;
    auto field = std::find_if(efficiency_fields().begin(), efficiency_fields().end(),
                              [&](const efficiency_field& f) { return key.Scalar() == f.key; });
    const std::string& written = value.Scalar();
    auto pos = value.Mark().pos;
    if (pos < 0 || text.compare(static_cast<size_t>(pos), written.size(), written) != 0) {
      error = fmt::format("cannot find the value of efficiency.{} in the text (line {})",
                          key.Scalar(), value.Mark().line + 1);
      return {};
    }
    edits.push_back({static_cast<size_t>(pos), written.size(),
                     format_number(fitted.*(field->member))});
  }
  std::sort(edits.begin(), edits.end(),
            [](const replacement& a, const replacement& b) { return a.pos > b.pos; });
  std::string out = text;
  for (const auto& e : edits)
    out.replace(e.pos, e.length, e.text);

  // The note goes on its own lines above the key's line, indented like the key; earlier
  // notes (our prefix, directly above) are replaced. Values sit after the key, so the key's
  // offset is unchanged by the edits above.
  auto lines = note_lines(note);
  if (!lines.empty()) {
    size_t key_pos = static_cast<size_t>(std::max(0, key_node.Mark().pos));
    size_t line_start = start_of_line(out, key_pos);
    std::string indent = out.substr(line_start, key_pos - line_start);
    if (indent.find_first_not_of(" \t") != std::string::npos)
      indent.clear();  // the key shares its line with other content (flow style)
    size_t block_start = line_start;  // earlier notes directly above are replaced
    while (block_start > 0) {
      size_t prev_end = block_start - 1;  // the '\n' ending the previous line
      size_t prev_start = start_of_line(out, prev_end);
      std::string_view prev(out.data() + prev_start, prev_end - prev_start);
      size_t first = prev.find_first_not_of(" \t");
      if (first == std::string_view::npos || prev.substr(first).rfind(note_prefix, 0) != 0)
        break;
      block_start = prev_start;
    }
    std::string inserted;
    for (const auto& line : lines)
      inserted += indent + std::string(note_prefix) + line + "\n";
    out.replace(block_start, line_start - block_start, inserted);
  }

  // The result must load and give back exactly the fitted constants.
  try {
    chip check = parse_chip_text(out, "(fitted chip file)", nullptr);
    for (const auto& f : efficiency_fields())
      if (check.efficiency.*f.member != fitted.*f.member) {
        error = fmt::format("internal error: efficiency.{} reads back as {}, not {}", f.key,
                            check.efficiency.*f.member, fitted.*f.member);
        return {};
      }
  } catch (const spec_failure& f) {
    error = "internal error: the rewritten chip file does not load: " + f.error.what();
    return {};
  }
  return out;
}

}  // namespace

bool load_chip_file(const std::string& path, chip& out, spec_error& error) {
  try {
    return load(path, out, error);
  } catch (const spec_failure& f) {
    error = f.error;
  } catch (const YAML::Exception& ex) {
    error = position_error(path, ex.mark, document_field,
                           "YAML syntax error: " + (ex.msg.empty() ? std::string("malformed YAML")
                                                                   : ex.msg));
  } catch (const std::exception& ex) {
    error = make_error(path, 0, 0, document_field,
                       fmt::format("cannot load the chip file: {}", ex.what()));
  }
  if (error.message.empty())
    error.message = "invalid chip file";
  return false;
}

std::string chips_dir() {
  const char* dir = std::getenv("MAXKERNEL_CHIPS_DIR");
  if (dir && *dir)
    return dir;
  return MAXKERNEL_SOURCE_DIR "/config/chips";
}

bool load_chip(std::string_view name, chip& out, spec_error& error) {
  // The model asks for the same chip for every candidate it prices: read each file once.
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, chip> cache;

  std::string dir = chips_dir();
  auto key = std::make_pair(dir, std::string(name));
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) {
    out = it->second;
    return true;
  }
  auto names = chip_names_in(dir);
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string message;
    if (names.empty()) {
      message = fmt::format("unknown chip '{}': there are no chip files (*.yaml) in {}; set "
                            "MAXKERNEL_CHIPS_DIR to the directory that holds them",
                            shown_value(name), dir);
    } else {
      std::string hint = nearest_name(name, names);
      message = fmt::format("unknown chip '{}'{}; known chips (the files in {}): {}",
                            shown_value(name),
                            hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint), dir,
                            join_names(names));
    }
    error = make_error("", 0, 0, "chip", std::move(message));
    return false;
  }
  chip loaded;
  if (!load_chip_file((fs::path(dir) / (std::string(name) + ".yaml")).string(), loaded, error))
    return false;
  out = cache.emplace(std::move(key), std::move(loaded)).first->second;
  return true;
}

std::string fitted_chip_yaml(const std::string& original_text, const chip_efficiency& fitted,
                             std::string_view note, std::string& error) {
  error.clear();
  try {
    return rewrite(original_text, fitted, note, error);
  } catch (const std::exception& ex) {
    error = fmt::format("cannot rewrite the chip file: {}", ex.what());
  }
  return {};
}

}  // namespace maxkernel::config
