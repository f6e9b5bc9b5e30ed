#include "config/brain_config.hpp"

#include "config/field_reader.hpp"
#include "config/node_budget.hpp"
#include "config/shown_value.hpp"
#include "config/spec_failure.hpp"
#include "config/spec_file.hpp"
#include "config/yaml_document.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <utility>

namespace maxkernel::config {

namespace {

constexpr const char* document_field = "(document)";
const std::vector<std::string> role_keys{"planner", "implementer", "debugger"};

// The limits keep a typo (a timeout in milliseconds, a price per token) from passing.
constexpr double max_timeout_seconds = 3600;
constexpr double max_backoff_seconds = 600;
constexpr int64_t max_retries = 20;
constexpr int64_t max_max_tokens = 10'000'000;

std::vector<std::string> top_level_keys() {
  std::vector<std::string> keys = role_keys;
  keys.emplace_back("llm");
  return keys;
}

spec_error position_error(const std::string& file, const YAML::Mark& mark, std::string field,
                          std::string message) {
  spec_error e;
  e.file = file;
  e.line = mark.line >= 0 ? mark.line + 1 : 1;
  e.column = mark.line >= 0 && mark.column >= 0 ? mark.column + 1 : 1;
  e.field = std::move(field);
  e.message = std::move(message);
  return e;
}

[[noreturn]] void throw_error(spec_error e) {
  spec_failure f;
  f.error = std::move(e);
  throw f;
}

// ---- Chains -------------------------------------------------------------------------------

brain_kind read_kind(const field_reader& r, const YAML::Node& n, const std::string& field) {
  std::string name = r.string(n, field);
  if (name == "expert")
    return brain_kind::expert;
  if (name == "llm")
    return brain_kind::llm;
  r.fail(n, field,
         fmt::format("unknown brain '{}'; a brain is expert or llm", shown_value(name)));
}

// Where a chain names llm, for the check that an llm section exists.
struct llm_use {
  std::string field;
  YAML::Mark mark;
};

// A chain is one brain or a list of distinct brains, tried in order.
std::vector<brain_kind> read_chain(const field_reader& r, const YAML::Node& n,
                                   const std::string& field, std::optional<llm_use>& use) {
  std::vector<brain_kind> chain;
  auto add = [&](const YAML::Node& item, const std::string& item_field) {
    brain_kind k = read_kind(r, item, item_field);
    if (std::find(chain.begin(), chain.end(), k) != chain.end())
      r.fail(item, item_field,
             fmt::format("{} appears twice in the chain; each brain is tried once",
                         to_string(k)));
    if (k == brain_kind::llm && !use)
      use = llm_use{item_field, item.Mark()};
    chain.push_back(k);
  };
  if (n.IsSequence()) {
    if (n.size() == 0)
      r.fail(n, field, "the chain is empty; name at least one brain (expert or llm)");
    for (size_t i = 0; i < n.size(); ++i)
      add(n[i], index_field(field, i));
  } else if (n.IsMap()) {
    r.fail(n, field,
           fmt::format("expected a brain (expert or llm) or a list like [expert, llm], got {}",
                       field_reader::describe(n)));
  } else {
    add(n, field);
  }
  return chain;
}

// ---- The llm section ----------------------------------------------------------------------

bool is_env_name(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])))
    return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string read_base_url(const field_reader& r, const YAML::Node& n, const std::string& field) {
  std::string url = r.string(n, field);
  bool http = url.rfind("http://", 0) == 0;
  bool https = url.rfind("https://", 0) == 0;
  if (!http && !https)
    r.fail(n, field,
           fmt::format("expected an http:// or https:// URL (like "
                       "https://api.openai.com/v1), got '{}'",
                       shown_value(url)));
  if (std::any_of(url.begin(), url.end(),
                  [](char c) { return std::isspace(static_cast<unsigned char>(c)) || c < 0x20; }))
    r.fail(n, field, "the URL contains whitespace");
  size_t host = url.find("://") + 3;
  if (host >= url.size() || url[host] == '/')
    r.fail(n, field, fmt::format("the URL '{}' has no host", shown_value(url)));
  if (url.find('?') != std::string::npos || url.find('#') != std::string::npos)
    r.fail(n, field,
           "the URL has a query or fragment; base_url is the API root that "
           "/chat/completions is appended to");
  while (!url.empty() && url.back() == '/')
    url.pop_back();
  if (url.size() >= 17 && url.compare(url.size() - 17, 17, "/chat/completions") == 0)
    r.fail(n, field,
           "base_url is the API root (like https://api.openai.com/v1); /chat/completions "
           "is appended to it");
  return url;
}

double read_range(const field_reader& r, const YAML::Node& n, const std::string& field,
                  double low, bool low_open, double high, const char* unit) {
  double v = r.number(n, field);
  if ((low_open ? v <= low : v < low) || v > high)
    r.fail(n, field,
           fmt::format("expected {} in {}{}, {}], got {}", unit, low_open ? "(" : "[", low, high,
                       v));
  return v;
}

int64_t read_count(const field_reader& r, const YAML::Node& n, const std::string& field,
                   int64_t low, int64_t high) {
  int64_t v = r.integer(n, field);
  if (v < low || v > high)
    r.fail(n, field, fmt::format("expected an integer from {} to {}, got {}", low, high, v));
  return v;
}

llm_prices read_prices(const field_reader& r, const YAML::Node& n) {
  const std::string field = "llm.prices";
  auto m = r.mapping(n, field, {"prompt", "completion"});
  llm_prices p;
  for (const char* key : {"prompt", "completion"}) {
    std::string f = child_field(field, key);
    const yaml_entry* e = m.find(key);
    if (!e)
      r.fail(m.mark, f,
             fmt::format("missing field '{}': prices give USD per million prompt and "
                         "completion tokens",
                         key));
    double v = r.number(e->value, f);
    if (v < 0)
      r.fail(e->value, f, fmt::format("a price must be >= 0 USD per million tokens, got {}", v));
    if (v > 10000)
      r.fail(e->value, f,
             fmt::format("{} USD per million tokens is implausible; prices are per MILLION "
                         "tokens",
                         v));
    (std::string(key) == "prompt" ? p.prompt_usd_per_million : p.completion_usd_per_million) = v;
  }
  return p;
}

llm_config read_llm(const field_reader& r, const YAML::Node& n) {
  const std::string field = "llm";
  auto m = r.mapping(n, field,
                     {"base_url", "model", "api_key_env", "api_key", "temperature", "max_tokens",
                      "timeout_seconds", "retries", "backoff_seconds", "prices"});
  llm_config c;
  for (const auto& e : m.entries) {
    std::string f = child_field(field, e.key);
    if (e.key == "api_key")
      r.fail(e.key_node, f,
             "the key itself never goes in the file: put it in an environment variable and "
             "name the variable in api_key_env (like api_key_env: OPENAI_API_KEY)");
    if (e.key == "base_url") {
      c.base_url = read_base_url(r, e.value, f);
    } else if (e.key == "model") {
      c.model = r.string(e.value, f);
      if (c.model.empty())
        r.fail(e.value, f, "the model name is empty");
    } else if (e.key == "api_key_env") {
      c.api_key_env = r.string(e.value, f);
      if (!is_env_name(c.api_key_env))
        r.fail(e.value, f,
               fmt::format("'{}' is not an environment variable name (letters, digits, '_'); "
                           "api_key_env names the variable that holds the key, never the key",
                           shown_value(c.api_key_env)));
    } else if (e.key == "temperature") {
      c.temperature = read_range(r, e.value, f, 0, false, 2, "a temperature");
    } else if (e.key == "max_tokens") {
      c.max_tokens = static_cast<uint32_t>(read_count(r, e.value, f, 1, max_max_tokens));
    } else if (e.key == "timeout_seconds") {
      c.timeout_seconds = read_range(r, e.value, f, 0, true, max_timeout_seconds, "seconds");
    } else if (e.key == "retries") {
      c.retries = static_cast<uint32_t>(read_count(r, e.value, f, 0, max_retries));
    } else if (e.key == "backoff_seconds") {
      c.backoff_seconds = read_range(r, e.value, f, 0, false, max_backoff_seconds, "seconds");
    } else if (e.key == "prices") {
      c.prices = read_prices(r, e.value);
    }
  }
  for (const char* required : {"base_url", "model"})
    if (!m.find(required))
      r.fail(m.mark, child_field(field, required),
             fmt::format("missing field '{}'; the llm section needs base_url and model",
                         required));
  return c;
}

// ---- The document -------------------------------------------------------------------------

brain_config parse(const YAML::Node& root, const field_reader& r) {
  brain_config c;
  if (!root.IsDefined() || root.IsNull())
    return c;  // an empty file (or only comments): the defaults
  if (!root.IsMap())
    r.fail(root, document_field,
           fmt::format("a brain config is a mapping (planner: expert, ...), got {}",
                       field_reader::describe(root)));
  auto m = r.mapping(root, "", top_level_keys());
  std::optional<llm_use> first_llm_use;
  for (const auto& e : m.entries) {
    if (e.key == "llm") {
      c.llm = read_llm(r, e.value);
      continue;
    }
    auto chain = read_chain(r, e.value, e.key, first_llm_use);
    if (e.key == "planner")
      c.planner = std::move(chain);
    else if (e.key == "implementer")
      c.implementer = std::move(chain);
    else
      c.debugger = std::move(chain);
  }
  if (first_llm_use && !c.llm)
    r.fail(first_llm_use->mark, first_llm_use->field,
           "the chain names llm but the file has no llm section (base_url, model, "
           "api_key_env, ...); see docs/brains.md");
  return c;
}

brain_config parse_text(const std::string& text, const std::string& file) {
  auto document = parse_single_document(text);
  if (!document.error.empty())
    throw_error(position_error(file, document.mark, document_field, document.error));
  auto budget = check_node_budget(document.root);
  if (!budget.ok)
    throw_error(position_error(file, budget.mark, budget.field, budget.message));
  field_reader reader(file);
  return parse(document.root, reader);
}

template <class F>
bool guarded(const std::string& file, spec_error& error, F&& body) {
  try {
    body();
    return true;
  } catch (const spec_failure& f) {
    error = f.error;
  } catch (const YAML::Exception& ex) {
    error = position_error(file, ex.mark, document_field,
                           "YAML syntax error: " + (ex.msg.empty() ? std::string("malformed YAML")
                                                                   : ex.msg));
  } catch (const std::exception& ex) {
    error = spec_error{};
    error.file = file;
    error.field = document_field;
    error.message = fmt::format("cannot load the brain config: {}", ex.what());
  }
  if (error.message.empty())
    error.message = "invalid brain config";
  return false;
}

}  // namespace

const char* to_string(brain_kind kind) {
  switch (kind) {
    case brain_kind::expert: return "expert";
    case brain_kind::llm: return "llm";
  }
  return "?";
}

brain_config default_brain_config() { return brain_config{}; }

bool parse_brain_config(const std::string& text, const std::string& file, brain_config& out,
                        spec_error& error) {
  brain_config parsed;
  if (!guarded(file, error, [&] { parsed = parse_text(text, file); }))
    return false;
  parsed.source_path = file;
  out = std::move(parsed);
  return true;
}

bool load_brain_config(const std::string& path, brain_config& out, spec_error& error) {
  spec_error file_error;
  auto text = read_text_file(path, file_error);
  if (!text) {
    error = file_error;
    error.file = path;
    error.field = document_field;
    return false;
  }
  return parse_brain_config(*text, path, out, error);
}

}  // namespace maxkernel::config
