#include "config/yaml_document.hpp"

#include <yaml-cpp/eventhandler.h>

#include <sstream>

namespace maxkernel::config {

namespace {

// A 1 MiB file has fewer tokens than this; more events means a parser loop.
constexpr size_t max_events = 4u << 20;

struct event_limit_reached {};

// Records the shape of each document without building nodes.
class document_scanner : public YAML::EventHandler {
public:
  size_t documents = 0;
  YAML::Mark last_document_start;
  YAML::Mark first_event;      // of the current document
  size_t events_in_document = 0;
  bool only_null = true;       // the current document is a lone null so far

  void OnDocumentStart(const YAML::Mark& mark) override {
    ++documents;
    last_document_start = mark;
    events_in_document = 0;
    only_null = true;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { event(mark, true); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { event(mark, false); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    event(mark, false);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    event(mark, false);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    event(mark, false);
  }
  void OnMapEnd() override {}

private:
  size_t total_ = 0;
  void event(const YAML::Mark& mark, bool is_null) {
    if (++total_ > max_events)
      throw event_limit_reached{};
    if (events_in_document++ == 0)
      first_event = mark;
    if (!is_null)
      only_null = false;
  }
};

bool stray_flow_character(const std::string& text, const YAML::Mark& mark) {
  if (mark.pos < 0 || static_cast<size_t>(mark.pos) >= text.size())
    return false;
  char c = text[static_cast<size_t>(mark.pos)];
  return c == ',';
}

}  // namespace

yaml_document parse_single_document(const std::string& text) {
  yaml_document out;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    document_scanner scanner;
    // Two documents at most: a second one is an error, and the ',' bug yields endless ones.
    for (int i = 0; i < 2 && parser.HandleNextDocument(scanner); ++i) {
      if (scanner.only_null && scanner.events_in_document == 1 &&
          stray_flow_character(text, scanner.first_event)) {
        out.error = "YAML syntax error: ',' outside a flow collection ([...] or {...})";
        out.mark = scanner.first_event;
        return out;
      }
    }
    if (scanner.documents > 1) {
      out.error = "a spec is one YAML document; this file holds several (`---`)";
      out.mark = scanner.last_document_start;
      return out;
    }
    out.root = YAML::Load(text);
  } catch (const YAML::Exception& ex) {
    out.error = "YAML syntax error: " + (ex.msg.empty() ? std::string("malformed YAML") : ex.msg);
    out.mark = ex.mark;
  } catch (const event_limit_reached&) {
    out.error = "the YAML parser did not terminate on this document";
    out.mark = YAML::Mark{};
  }
  return out;
}

}  // namespace maxkernel::config
