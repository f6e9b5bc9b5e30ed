#include "cli/measurements_csv.hpp"

#include "config/chip_names.hpp"
#include "config/nearest_name.hpp"
#include "config/utf8_check.hpp"

#include <csv.h>
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace maxkernel::cli {

namespace fs = std::filesystem;

namespace {

constexpr std::array<const char*, 5> columns{"spec", "kernel", "chip", "measured_us", "source"};
constexpr uint64_t max_csv_bytes = 16 << 20;

struct parse_state {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> current;
};

void on_field(void* text, size_t size, void* data) {
  auto* s = static_cast<parse_state*>(data);
  s->current.emplace_back(static_cast<const char*>(text), size);
}

void on_record(int, void* data) {
  auto* s = static_cast<parse_state*>(data);
  s->records.push_back(std::move(s->current));
  s->current.clear();
}

std::string trim(std::string s) {
  auto b = s.find_first_not_of(" \t\r");
  auto e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

bool read_measurements(const std::string& path, std::vector<measurement_row>& rows,
                       std::string& error) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    error = path + ": no such measurements file";
    return false;
  }
  if (fs::file_size(path, ec) > max_csv_bytes) {
    error = path + ": measurements file is larger than 16 MiB";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (auto bad = config::find_invalid_text(text)) {
    error = fmt::format("{}:{}:{}: {}", path, bad->line, bad->column, bad->message);
    return false;
  }
  // Lines of each record, for error messages: libcsv reports records, not lines; rows with
  // quoted newlines are rare, so a record's line is counted from the newlines before it.
  parse_state state;
  csv_parser parser;
  if (csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL | CSV_EMPTY_IS_NULL) != 0) {
    error = "cannot initialise the CSV parser";
    return false;
  }
  std::vector<unsigned> record_lines;
  unsigned line = 1;
  size_t done = 0;
  // Feed line by line to know where each record starts.
  while (done < text.size()) {
    size_t end = text.find('\n', done);
    end = end == std::string::npos ? text.size() : end + 1;
    size_t before = state.records.size();
    if (csv_parse(&parser, text.data() + done, end - done, on_field, on_record, &state)
        != end - done) {
      error = fmt::format("{}:{}: malformed CSV: {}", path, line,
                          csv_strerror(csv_error(&parser)));
      csv_free(&parser);
      return false;
    }
    for (size_t r = before; r < state.records.size(); ++r)
      record_lines.push_back(line);
    done = end;
    ++line;
  }
  if (csv_fini(&parser, on_field, on_record, &state) != 0) {
    error = fmt::format("{}:{}: malformed CSV: {}", path, line - 1,
                        csv_strerror(csv_error(&parser)));
    csv_free(&parser);
    return false;
  }
  while (record_lines.size() < state.records.size())
    record_lines.push_back(line - 1);
  csv_free(&parser);

  if (state.records.empty()) {
    error = path + ":1: empty file: expected the header " + fmt::format("{}", fmt::join(columns, ","));
    return false;
  }
  std::array<int, columns.size()> index{};
  index.fill(-1);
  const auto& header = state.records[0];
  for (size_t c = 0; c < header.size(); ++c) {
    auto name = trim(header[c]);
    for (size_t k = 0; k < columns.size(); ++k)
      if (name == columns[k])
        index[k] = static_cast<int>(c);
  }
  for (size_t k = 0; k < columns.size(); ++k)
    if (index[k] < 0) {
      error = fmt::format("{}:1: header: column '{}' is missing (need {})", path, columns[k],
                          fmt::join(columns, ","));
      return false;
    }
  fs::path base = fs::path(path).parent_path();
  for (size_t r = 1; r < state.records.size(); ++r) {
    const auto& rec = state.records[r];
    unsigned at = record_lines[r];
    if (rec.size() == 1 && trim(rec[0]).empty())
      continue;  // a blank line
    auto field = [&](size_t k) {
      size_t c = static_cast<size_t>(index[k]);
      return c < rec.size() ? trim(rec[c]) : std::string();
    };
    measurement_row row;
    row.line = at;
    for (size_t k = 0; k < 3; ++k)
      if (field(k).empty()) {
        error = fmt::format("{}:{}: {}: empty", path, at, columns[k]);
        return false;
      }
    row.spec = (base / field(0)).lexically_normal().string();
    row.kernel = field(1) == "reference" ? "reference"
                                         : (base / field(1)).lexically_normal().string();
    row.chip = field(2);
    if (!config::is_known_chip(row.chip)) {
      auto known = config::chip_names();
      auto hint = config::nearest_name(row.chip, known);
      error = fmt::format("{}:{}: chip: unknown chip '{}'{} (known: {})", path, at, row.chip,
                          hint.empty() ? "" : "; did you mean '" + hint + "'?",
                          fmt::join(known, ", "));
      return false;
    }
    auto m = field(3);
    auto [ptr, err] = std::from_chars(m.data(), m.data() + m.size(), row.measured_us);
    if (err != std::errc() || ptr != m.data() + m.size() || !std::isfinite(row.measured_us)
        || row.measured_us <= 0) {
      error = fmt::format("{}:{}: measured_us: '{}' is not a positive number of microseconds",
                          path, at, m);
      return false;
    }
    row.source = field(4);
    if (!fs::exists(row.spec, ec)) {
      error = fmt::format("{}:{}: spec: {} does not exist", path, at, row.spec);
      return false;
    }
    if (row.kernel != "reference" && !fs::is_regular_file(row.kernel, ec)) {
      error = fmt::format("{}:{}: kernel: {} is not a file (or the word reference)", path, at,
                          row.kernel);
      return false;
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) {
    error = path + ": no measurement rows";
    return false;
  }
  return true;
}

}  // namespace maxkernel::cli
