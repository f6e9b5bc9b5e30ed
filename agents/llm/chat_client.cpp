#include "agents/llm/chat_client.hpp"

#include <curl/curl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace maxkernel::agents::llm {
namespace {

using messages::error_code;
using json = nlohmann::json;

constexpr size_t max_body_bytes = 32u << 20;       // a chat reply is far smaller
constexpr double max_wait_seconds = 600;            // longer Retry-After: give up instead
constexpr double max_connect_seconds = 30;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One line, at most `limit` characters: server bodies can be HTML pages.
std::string snippet(const std::string& text, size_t limit = 300) {
  std::string out;
  for (char c : text) {
    if (out.size() >= limit) {
      out += "...";
      break;
    }
    out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  }
  return out;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return std::string(s.substr(b, e - b));
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// ---- One HTTP exchange --------------------------------------------------------------------

struct http_response {
  CURLcode curl = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::string body;
  bool body_too_large = false;
  std::string retry_after;  // the header's value, "" when absent
  std::string location;
};

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* r = static_cast<http_response*>(user);
  size_t bytes = size * count;
  if (r->body.size() + bytes > max_body_bytes) {
    r->body_too_large = true;
    return 0;  // aborts the transfer
  }
  r->body.append(data, bytes);
  return bytes;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* r = static_cast<http_response*>(user);
  size_t bytes = size * count;
  std::string_view line(data, bytes);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after 100 Continue): start over
    r->retry_after.clear();
    r->location.clear();
    return bytes;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos)
    return bytes;
  std::string_view name = line.substr(0, colon);
  if (iequals(name, "retry-after"))
    r->retry_after = trim(line.substr(colon + 1));
  else if (iequals(name, "location"))
    r->location = trim(line.substr(colon + 1));
  return bytes;
}

http_response post(const std::string& url, const std::string& body, const std::string& key,
                   double timeout_seconds) {
  global_init();
  http_response r;
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> handle(curl_easy_init(),
                                                              curl_easy_cleanup);
  if (!handle) {
    r.curl = CURLE_FAILED_INIT;
    r.curl_error = "curl_easy_init failed";
    return r;
  }
  CURL* h = handle.get();
  curl_slist* list = nullptr;
  list = curl_slist_append(list, "Content-Type: application/json");
  list = curl_slist_append(list, "Accept: application/json");
  list = curl_slist_append(list, "Expect:");  // no 100-continue round trip for large prompts
  std::string auth;
  if (!key.empty()) {
    auth = "Authorization: Bearer " + key;
    list = curl_slist_append(list, auth.c_str());
  }
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> headers(list,
                                                                      curl_slist_free_all);
  char error_buffer[CURL_ERROR_SIZE] = {0};
  auto ms = [](double s) { return static_cast<long>(std::ceil(s * 1000.0)); };

  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(h, CURLOPT_USERAGENT, "maxkernel/" MAXKERNEL_VERSION);
  curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");  // whatever this libcurl decodes
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms(timeout_seconds));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   ms(std::min(timeout_seconds, max_connect_seconds)));
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // called from several threads
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);  // a redirected POST is a config error
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_buffer);

  r.curl = curl_easy_perform(h);
  if (r.curl != CURLE_OK)
    r.curl_error = error_buffer[0] ? error_buffer : curl_easy_strerror(r.curl);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  return r;
}

// ---- What to do with a response -----------------------------------------------------------

struct outcome {
  enum class kind { ok, retry, fail } what = kind::fail;
  std::string problem;
  double retry_after = -1;  // seconds the server asked to wait; -1: none
};

outcome retry(std::string problem, double after = -1) {
  return {outcome::kind::retry, std::move(problem), after};
}
outcome fail(std::string problem) { return {outcome::kind::fail, std::move(problem), -1}; }

// Seconds from a Retry-After value (delta-seconds or an HTTP date); -1 when absent or bad.
double parse_retry_after(const std::string& value) {
  if (value.empty())
    return -1;
  char* end = nullptr;
  double seconds = std::strtod(value.c_str(), &end);
  if (end != value.c_str() && *end == '\0' && std::isfinite(seconds))
    return std::max(0.0, seconds);
  time_t when = curl_getdate(value.c_str(), nullptr);
  if (when == -1)
    return -1;
  return std::max(0.0, std::difftime(when, std::time(nullptr)));
}

// The message of an OpenAI-style error body ({"error": {"message": ...}}, or Gemini's list
// of them), else a snippet of the body.
std::string server_message(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_array() && !j.empty())
    j = j[0];
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return snippet(e["message"].get<std::string>());
    if (e.is_string())
      return snippet(e.get<std::string>());
  }
  if (j.is_object() && j.contains("message") && j["message"].is_string())
    return snippet(j["message"].get<std::string>());
  return body.empty() ? "(empty body)" : snippet(body);
}

bool is_count(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() && !j[key].is_number_float() &&
         j[key].get<int64_t>() >= 0;
}

// Reads a 2xx body; tokens are counted even when the content is unusable (they were spent).
outcome read_completion(const std::string& body, chat_completion& out, usage_tally& tally) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded())
    return retry("malformed JSON in the response body: " + snippet(body, 200));
  if (!j.is_object())
    return retry("the response body is JSON but not an object: " + snippet(body, 200));
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    if (is_count(u, "prompt_tokens") && is_count(u, "completion_tokens")) {
      out.prompt_tokens = u["prompt_tokens"].get<uint64_t>();
      out.completion_tokens = u["completion_tokens"].get<uint64_t>();
      out.has_usage = true;
      tally.prompt_tokens += out.prompt_tokens;
      tally.completion_tokens += out.completion_tokens;
    }
  }
  if (j.contains("error") && !j.contains("choices"))
    return retry("the server answered with an error: " + server_message(body));
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty())
    return retry("the response has no choices: " + snippet(body, 200));
  const json& choice = j["choices"][0];
  if (!choice.is_object() || !choice.contains("message") || !choice["message"].is_object())
    return retry("choices[0] has no message: " + snippet(body, 200));
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
    out.finish_reason = choice["finish_reason"].get<std::string>();
  const json& message = choice["message"];
  if (!message.contains("content") || !message["content"].is_string())
    return retry(fmt::format("choices[0].message has no text content (finish_reason: {})",
                             out.finish_reason.empty() ? "none" : out.finish_reason));
  out.content = message["content"].get<std::string>();
  return {outcome::kind::ok, {}, -1};
}

std::string hint_for(long status, const config::llm_config& c) {
  if (status == 401 || status == 403)
    return c.api_key_env.empty()
               ? "the server wants an API key: set llm.api_key_env to the variable holding it"
               : fmt::format("check the key in ${} (llm.api_key_env)", c.api_key_env);
  if (status == 404)
    return "check llm.base_url (the API root, like https://api.openai.com/v1) and llm.model";
  if (status == 400 || status == 422)
    return "the server refused the request";
  return {};
}

outcome classify(const http_response& r, const config::llm_config& c, chat_completion& out,
                 usage_tally& tally) {
  if (r.body_too_large)
    return fail(fmt::format("the response is larger than {} MiB", max_body_bytes >> 20));
  if (r.curl != CURLE_OK) {
    switch (r.curl) {
      case CURLE_OPERATION_TIMEDOUT:
        return retry(fmt::format("no complete reply within {} s (llm.timeout_seconds): {}",
                                 c.timeout_seconds, r.curl_error));
      case CURLE_COULDNT_RESOLVE_HOST:
      case CURLE_COULDNT_RESOLVE_PROXY:
      case CURLE_COULDNT_CONNECT:
      case CURLE_SEND_ERROR:
      case CURLE_RECV_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_PARTIAL_FILE:
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
        return retry("connection failed: " + r.curl_error);
      case CURLE_PEER_FAILED_VERIFICATION:
      case CURLE_SSL_CACERT_BADFILE:
        return fail("TLS verification failed (the certificate is not trusted): " +
                    r.curl_error);
      default:
        return fail(fmt::format("libcurl error {}: {}", static_cast<int>(r.curl), r.curl_error));
    }
  }
  long s = r.status;
  if (s >= 200 && s < 300)
    return read_completion(r.body, out, tally);
  if (s == 429)
    return retry(fmt::format("HTTP 429 (rate limited): {}", server_message(r.body)),
                 parse_retry_after(r.retry_after));
  if (s >= 500)
    return retry(fmt::format("HTTP {}: {}", s, server_message(r.body)),
                 parse_retry_after(r.retry_after));
  if (s >= 300 && s < 400)
    return fail(fmt::format("HTTP {}: redirected to {}; set llm.base_url to the final URL", s,
                            r.location.empty() ? "(no Location)" : r.location));
  std::string hint = hint_for(s, c);
  return fail(fmt::format("HTTP {}: {}{}", s, server_message(r.body),
                          hint.empty() ? "" : "; " + hint));
}

// The API key from the environment; an error message when it is named but unusable.
std::optional<std::string> read_key(const config::llm_config& c, std::string& key) {
  key.clear();
  if (c.api_key_env.empty())
    return std::nullopt;
  const char* value = std::getenv(c.api_key_env.c_str());
  if (!value || !*value)
    return fmt::format("the environment variable {} (llm.api_key_env) is not set; export it "
                       "with the API key",
                       c.api_key_env);
  key = value;
  if (std::any_of(key.begin(), key.end(),
                  [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; })) {
    key.clear();
    return fmt::format("the value of {} (llm.api_key_env) contains a control character "
                       "(a newline?)",
                       c.api_key_env);
  }
  return std::nullopt;
}

std::string request_body(const config::llm_config& c, const std::vector<chat_message>& msgs) {
  json j;
  j["model"] = c.model;
  j["temperature"] = c.temperature;
  j["max_tokens"] = c.max_tokens;
  json list = json::array();
  for (const auto& m : msgs)
    list.push_back({{"role", m.role}, {"content", m.content}});
  j["messages"] = std::move(list);
  // Invalid UTF-8 in a prompt (a kernel's bytes) must not throw: replace it.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

chat_client::chat_client(config::llm_config config) : config_(std::move(config)) {}

std::string chat_client::endpoint() const { return config_.base_url + "/chat/completions"; }

brain_status chat_client::complete(const std::vector<chat_message>& messages,
                                   chat_completion& out, usage_tally& tally) const {
  const std::string url = endpoint();
  auto unavailable = [&](const std::string& problem) {
    return brain_status::fail(error_code::service_unavailable,
                              fmt::format("LLM endpoint {}: {}", url, problem));
  };
  std::string key;
  if (auto problem = read_key(config_, key))
    return unavailable(*problem);
  const std::string body = request_body(config_, messages);
  const uint32_t attempts = config_.retries + 1;
  std::string last;
  for (uint32_t i = 0; i < attempts; ++i) {
    out = chat_completion{};
    ++tally.calls;
    outcome o = classify(post(url, body, key, config_.timeout_seconds), config_, out, tally);
    if (o.what == outcome::kind::ok)
      return {};
    if (o.what == outcome::kind::fail)
      return unavailable(o.problem);
    last = o.problem;
    if (i + 1 == attempts)
      break;
    double wait = o.retry_after >= 0 ? o.retry_after
                                     : config_.backoff_seconds * std::pow(2.0, static_cast<double>(i));
    if (o.retry_after > max_wait_seconds)
      return unavailable(fmt::format("{}; the server asks to retry after {} s (more than {} s): "
                                     "giving up",
                                     last, o.retry_after, max_wait_seconds));
    wait = std::min(wait, max_wait_seconds);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  return unavailable(fmt::format("no usable reply after {} attempt{} (llm.retries: {}); last: {}",
                                 attempts, attempts == 1 ? "" : "s", config_.retries, last));
}

}  // namespace maxkernel::agents::llm
