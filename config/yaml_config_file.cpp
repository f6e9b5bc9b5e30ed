#include "config/yaml_config_file.hpp"

#include "config/node_budget.hpp"
#include "config/spec_error.hpp"
#include "config/spec_failure.hpp"
#include "config/spec_file.hpp"
#include "config/yaml_document.hpp"

#include <fmt/format.h>

namespace maxkernel::config {

namespace {

constexpr const char* document_field = "(document)";

}  // namespace

void throw_config_error(const std::string& file, const YAML::Mark& mark,
                        const std::string& field, const std::string& message) {
  spec_failure f;
  f.error.file = file;
  f.error.line = mark.line >= 0 ? mark.line + 1 : 1;
  f.error.column = mark.line >= 0 && mark.column >= 0 ? mark.column + 1 : 1;
  f.error.field = field;
  f.error.message = message;
  throw f;
}

bool parse_config_document(const std::string& text, const std::string& file,
                           const std::string& what,
                           const std::function<void(const YAML::Node&)>& parse,
                           std::string& error) {
  try {
    auto document = parse_single_document(text);
    if (!document.error.empty())
      throw_config_error(file, document.mark, document_field, document.error);
    auto budget = check_node_budget(document.root);
    if (!budget.ok)
      throw_config_error(file, budget.mark, budget.field, budget.message);
    parse(document.root);
    return true;
  } catch (const spec_failure& f) {
    error = f.error.what();
  } catch (const YAML::Exception& ex) {
    spec_error e;
    e.file = file;
    e.line = ex.mark.line >= 0 ? ex.mark.line + 1 : 0;
    e.column = ex.mark.line >= 0 && ex.mark.column >= 0 ? ex.mark.column + 1 : 0;
    e.field = document_field;
    e.message = "YAML syntax error: " + (ex.msg.empty() ? std::string("malformed YAML") : ex.msg);
    error = e.what();
  } catch (const std::exception& ex) {
    error = fmt::format("{}: cannot load {}: {}", file, what, ex.what());
  }
  return false;
}

std::optional<std::string> read_config_file(const std::string& path, std::string& error) {
  spec_error file_error;
  auto text = read_text_file(path, file_error);
  if (!text) {
    file_error.file = path;
    file_error.field = "";
    error = file_error.what();
  }
  return text;
}

}  // namespace maxkernel::config
