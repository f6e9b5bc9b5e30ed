#include "config/native_spec_loader.hpp"

#include "config/chip_names.hpp"
#include "config/field_reader.hpp"
#include "config/kernel_spec_writer.hpp"
#include "config/native_spec_parser.hpp"
#include "config/nearest_name.hpp"
#include "config/node_budget.hpp"
#include "config/spec_failure.hpp"
#include "config/spec_file.hpp"
#include "config/yaml_document.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <exception>
#include <filesystem>

namespace maxkernel::config {

namespace fs = std::filesystem;

namespace {

constexpr const char* document_field = "(document)";

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

// yaml-cpp's messages start lowercase and have no position; we add the position ourselves.
spec_error from_yaml_exception(const std::string& file, const YAML::Exception& ex) {
  int line = ex.mark.line >= 0 ? ex.mark.line + 1 : 0;
  int column = ex.mark.column >= 0 ? ex.mark.column + 1 : 0;
  std::string msg = ex.msg.empty() ? std::string("malformed YAML") : ex.msg;
  return make_error(file, line, column, document_field, "YAML syntax error: " + msg);
}

bool load(const std::string& path, const spec_load_options& opts,
          schema::KernelSpec::Builder out, spec_error& err) {
  if (!opts.chip_override.empty() && !is_known_chip(opts.chip_override)) {
    std::string hint = nearest_name(opts.chip_override, chip_names());
    err = make_error("", 0, 0, "--chip",
                     fmt::format("unknown chip '{}'{}; expected one of {}", opts.chip_override,
                                 hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                                 join_names(chip_names())));
    return false;
  }

  spec_error file_err;
  auto text = read_text_file(path, file_err);
  if (!text) {
    err = make_error(path, file_err.line, file_err.column, document_field, file_err.message);
    return false;
  }

  auto document = parse_single_document(*text);
  if (!document.error.empty()) {
    int line = document.mark.line >= 0 ? document.mark.line + 1 : 1;
    int column = document.mark.column >= 0 ? document.mark.column + 1 : 1;
    err = make_error(path, line, column, document_field, document.error);
    return false;
  }
  YAML::Node root = document.root;
  if (!root.IsDefined() || root.IsNull()) {
    err = make_error(path, 1, 1, document_field, "the spec is empty");
    return false;
  }

  auto budget = check_node_budget(root);
  if (!budget.ok) {
    err = make_error(path, budget.mark.line + 1, budget.mark.column + 1, budget.field,
                     budget.message);
    return false;
  }

  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec).lexically_normal();
  fs::path spec_dir = fs::canonical(absolute.parent_path(), ec);
  if (ec) {
    err = make_error(path, 0, 0, document_field, "cannot resolve the spec's directory: " +
                                                     ec.message());
    return false;
  }
  spec_parse_context ctx;
  ctx.spec_dir = spec_dir;
  ctx.source_path = absolute.string();
  ctx.chip_override = opts.chip_override;
  ctx.memory_limit_bytes = opts.memory_limit_bytes;

  field_reader reader(path);
  native_spec spec = parse_native_spec(root, ctx, reader);
  write_kernel_spec(spec, out);
  return true;
}

}  // namespace

bool load_native_spec(const std::string& path, const spec_load_options& opts,
                      schema::KernelSpec::Builder out, spec_error& err) {
  try {
    return load(path, opts, out, err);
  } catch (const spec_failure& f) {
    err = f.error;
  } catch (const YAML::Exception& ex) {
    err = from_yaml_exception(path, ex);
  } catch (const std::exception& ex) {
    err = make_error(path, 0, 0, document_field, fmt::format("cannot load the spec: {}", ex.what()));
  } catch (...) {
    err = make_error(path, 0, 0, document_field, "cannot load the spec: unknown error");
  }
  if (err.message.empty())
    err.message = "invalid spec";
  return false;
}

}  // namespace maxkernel::config
