#include "actors/search_record.hpp"

#include "messages/content_hash.hpp"
#include "search/kernel_fingerprint.hpp"
#include "search/search_graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string_view>
#include <system_error>

namespace maxkernel::actors {

search_record::search_record() { usage_.initRoot<schema::Usage>(); }
search_record::~search_record() = default;

bool search_record::open(const std::string& graph_path, schema::KernelSpec::Reader spec,
                         schema::SearchSettings::Reader settings, bool resume,
                         std::string& error) {
  vertices_.clear();
  readers_.clear();
  kernels_.clear();
  transcript_.clear();
  resumed_ = false;
  graph_.reset();
  if (graph_path.empty())
    return true;
  auto graph = search::search_graph::open(graph_path, error);
  if (!graph)
    return false;
  if (!graph->begin(search_header_for(spec, settings), resume, resumed_, error))
    return false;
  std::vector<std::string> stored, transcript;
  if (resumed_) {
    stored = graph->vertices(error);
    if (error.empty())
      transcript = graph->transcript(error);
    if (!error.empty())
      return false;
  }
  try {
    graph_ = std::make_unique<search::graph_writer>(std::move(graph));
  } catch (const std::system_error& e) {  // no thread to be had
    error = graph_path + ": cannot start the thread that writes the search graph: " + e.what();
    return false;
  }
  for (size_t i = 0; i < stored.size(); ++i) {
    auto msg = messages::decode<schema::Vertex>(stored[i], error);
    if (!msg) {
      error = fmt::format("{}: vertex {}: {}", graph_path, i, error);
      return false;
    }
    msg->allow_rereading();
    if (msg->root<schema::Vertex>().getIndex() != i) {
      error = fmt::format("{}: vertex {} is stored at position {}", graph_path,
                          msg->root<schema::Vertex>().getIndex(), i);
      return false;
    }
    readers_.push_back(msg->root<schema::Vertex>());
    vertices_.push_back(std::move(*msg));
  }
  reindex();
  transcript_ = std::move(transcript);
  return true;
}

bool search_record::append_transcript(const std::string& entry, std::string& error) {
  if (graph_ && (!graph_->flush(error) || !graph_->graph().append_transcript(entry, error)))
    return false;
  transcript_.push_back(entry);
  return true;
}

bool search_record::flush(std::string& error) { return !graph_ || graph_->flush(error); }

bool search_record::put(schema::Vertex::Reader v, std::string& error) {
  return put_all({messages::encode_root(v)}, error);
}

bool search_record::put_all(const std::vector<std::string>& all, std::string& error) {
  // Checked first (indices follow on from the record), then written, then kept. The bytes are
  // Vertex messages this process built (the lineages', put's and mark_exhausted's encodings;
  // a resumed search's stored vertices are decoded with the full check in open), so they are
  // read without decode's check (decoded_message::from_own), once, and handed to the graph
  // file decoded.
  std::vector<messages::decoded_message> decoded;
  decoded.reserve(all.size());
  size_t next = vertices_.size();
  for (const auto& bytes : all) {
    if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) {
      error = fmt::format("vertex bytes of {} bytes are not a message", bytes.size());
      return false;
    }
    auto msg = messages::decoded_message::from_own(bytes);
    size_t i = msg.root<schema::Vertex>().getIndex();
    if (i > next) {
      error = fmt::format("vertex {} added after {} vertices", i, next);
      return false;
    }
    next = std::max(next, i + 1);
    decoded.push_back(std::move(msg));
  }
  if (graph_ && !graph_->put(all, decoded, error))
    return false;
  bool rebuild = false;
  for (auto& msg : decoded) {
    auto v = msg.root<schema::Vertex>();
    size_t i = v.getIndex();
    if (i < vertices_.size()) {
      auto old = vertex(i);
      bool was_evaluated = old.getState() != schema::VertexState::PENDING;
      // A different candidate (a repaired lineage) or the best replaced: the indices are
      // rebuilt; else only the new vertex is weighed.
      rebuild = rebuild || static_cast<int>(i) == best_ ||
                old.getCandidate().getId() != v.getCandidate().getId();
      evaluated_ -= was_evaluated ? 1 : 0;
      vertices_[i] = std::move(msg);
      readers_[i] = v;
    } else {
      vertices_.push_back(std::move(msg));
      readers_.push_back(v);
    }
    // Its fingerprint is its own: only a vertex put again is computed again.
    kernels_.resize(std::max(kernels_.size(), i + 1));
    kernels_[i].reset();
    if (!rebuild)
      weigh(i);
  }
  if (rebuild)
    reindex();
  return true;
}

void search_record::weigh(size_t i) {
  auto v = vertex(i);
  first_of_id_.emplace(v.getCandidate().getId().cStr(), i);
  // The kernels its repairs replaced: a planner's step that yields one again is not new.
  for (auto id : v.getTriedIds())
    tried_of_id_.emplace(id.cStr(), i);
  if (v.getState() != schema::VertexState::PENDING)
    ++evaluated_;
  if (v.getState() != schema::VertexState::EVALUATED || !v.getCorrect() || v.getTimeUs() <= 0 ||
      !accepted(v))
    return;
  double best_us = best_ < 0 ? 0 : vertex(static_cast<size_t>(best_)).getTimeUs();
  // The first of equal times wins, as in a full pass.
  if (best_ < 0 || v.getTimeUs() < best_us ||
      (v.getTimeUs() == best_us && static_cast<int>(i) < best_))
    best_ = static_cast<int>(i);
}

void search_record::reindex() {
  first_of_id_.clear();
  tried_of_id_.clear();
  // Fingerprints cached so far stay (each is its own vertex's); vertices loaded by open
  // get a slot.
  kernels_.resize(vertices_.size());
  best_ = -1;
  evaluated_ = 0;
  for (size_t i = 0; i < vertices_.size(); ++i)
    weigh(i);
}

bool search_record::mark_exhausted(size_t i, std::string& error) {
  capnp::MallocMessageBuilder msg;
  msg.setRoot(vertex(i));
  msg.getRoot<schema::Vertex>().setExhausted(true);
  return put_all({messages::encode(msg)}, error);
}


int search_record::find_candidate(const std::string& id) const {
  auto it = first_of_id_.find(id);
  return it == first_of_id_.end() ? -1 : static_cast<int>(it->second);
}

int search_record::find_tried(const std::string& id) const {
  if (int i = find_candidate(id); i >= 0)
    return i;
  auto it = tried_of_id_.find(id);
  return it == tried_of_id_.end() ? -1 : static_cast<int>(it->second);
}

const std::string& search_record::kernel_fingerprint(size_t i) const {
  auto& kernel = kernels_[i];
  if (!kernel) {
    auto v = vertex(i);
    bool timed = v.getState() == schema::VertexState::EVALUATED && v.getCorrect() &&
                 v.getTimeUs() > 0;
    kernel = timed && v.getHasResult() && v.getResult().getHasStructure()
               ? search::kernel_fingerprint(v.getResult().getStructure())
               : std::string();
  }
  return *kernel;
}

int search_record::best() const { return best_; }

double search_record::best_time_us() const {
  return best_ < 0 ? 0 : vertex(static_cast<size_t>(best_)).getTimeUs();
}

unsigned search_record::evaluated() const { return evaluated_; }

void search_record::fill_history(schema::PlannerRequest::Builder request,
                                 const std::string& parent_id) const {
  std::vector<size_t> done;
  for (size_t i = 0; i < vertices_.size(); ++i)
    if (vertex(i).getState() != schema::VertexState::PENDING && vertex(i).getHasResult())
      done.push_back(i);
  int parent = parent_id.empty() ? -1 : find_candidate(parent_id);
  auto history = request.initHistory(static_cast<unsigned>(done.size()));
  for (unsigned k = 0; k < done.size(); ++k) {
    auto v = vertex(done[k]);
    auto h = history[k];
    bool full = static_cast<int>(done[k]) == best_ || static_cast<int>(done[k]) == parent ||
                k + full_recent >= done.size();
    if (!full) {
      // What the planners read of every entry: which kernel (template, params) and how it did.
      auto from = v.getCandidate();
      auto c = h.initCandidate();
      c.setSchemaVersion(from.getSchemaVersion());
      c.setId(from.getId());
      c.setTemplate(from.getTemplate());
      c.setParams(from.getParams());
      c.setParentId(from.getParentId());
      c.setStrategy(from.getStrategy());
      c.setOrigin(from.getOrigin());
      auto r = h.initResult();
      r.setSchemaVersion(v.getResult().getSchemaVersion());
      r.setCorrect(v.getResult().getCorrect() && v.getCorrect() && accepted(v));
      r.setHasProfile(v.getResult().getHasProfile());
      if (v.getResult().getHasProfile()) {
        auto p = r.initProfile();
        auto fp = v.getResult().getProfile();
        p.setTiming(fp.getTiming());
        p.setChip(fp.getChip());
        p.setTimeUs(fp.getTimeUs());
        p.setRooflineUs(fp.getRooflineUs());
        p.setBound(fp.getBound());
      }
      continue;
    }
    h.setCandidate(v.getCandidate());
    h.setResult(v.getResult());
    // A lineage the tester failed passed the node's own test, and one the operator did not
    // accept may be correct: the planner must take neither for a parent.
    if (!v.getCorrect() || !accepted(v))
      h.getResult().setCorrect(false);
    h.setHasDiagnosis(v.getHasDiagnosis());
    if (v.getHasDiagnosis())
      h.setDiagnosis(v.getDiagnosis());
  }
  std::vector<std::string> guidance;
  for (size_t i = 0; i < vertices_.size(); ++i) {
    auto v = vertex(i);
    if (v.getFeedback().size() == 0)
      continue;
    guidance.push_back(v.getDecision() == "approved"
                         ? std::string(v.getFeedback().cStr())
                         : fmt::format("the operator {} vertex {} ({}): {}",
                                       v.getDecision().cStr(), v.getIndex(),
                                       v.getStrategy().cStr(), v.getFeedback().cStr()));
  }
  auto g = request.initGuidance(static_cast<unsigned>(guidance.size()));
  for (unsigned k = 0; k < guidance.size(); ++k)
    g.set(k, guidance[k]);
}

void search_record::add_usage(schema::Usage::Reader u) {
  auto total = usage_.getRoot<schema::Usage>();
  total.setPromptTokens(total.getPromptTokens() + u.getPromptTokens());
  total.setCompletionTokens(total.getCompletionTokens() + u.getCompletionTokens());
  total.setCalls(total.getCalls() + u.getCalls());
  total.setCostUsd(total.getCostUsd() + u.getCostUsd());
  total.setHasCost(total.getHasCost() || u.getHasCost());
}

std::string search_record::result_bytes(const std::string& stop_reason, unsigned rounds) const {
  // One first segment that holds every vertex's copy (their sizes are known): no growth of
  // the message through ever larger segments, each zeroed, while a large graph is copied.
  size_t words = 1024;
  for (const auto& v : vertices_)
    words += v.words();
  for (const auto& t : transcript_)
    words += t.size() / sizeof(capnp::word) + 2;
  capnp::MallocMessageBuilder msg(
    static_cast<unsigned>(std::min<size_t>(words, size_t{1} << 28)));  // capnp: < 2^29 words
  auto r = msg.initRoot<schema::OptimizeResult>();
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  auto list = r.initVertices(static_cast<unsigned>(vertices_.size()));
  unsigned evaluations = 0, hits = 0, candidates = 0;
  std::map<std::string, unsigned> failures;
  std::vector<double> curve;
  double best_us = 0;
  for (unsigned i = 0; i < vertices_.size(); ++i) {
    auto v = vertex(i);
    list.setWithCaveats(i, v);
    evaluations += v.getEvaluations();
    hits += v.getCacheHits();
    for (auto f : v.getAttemptFailures())
      ++failures[f.cStr()];
    if (v.getState() == schema::VertexState::PENDING)
      continue;
    ++candidates;
    if (v.getState() == schema::VertexState::EVALUATED && v.getCorrect() && v.getTimeUs() > 0 &&
        accepted(v) && (best_us == 0 || v.getTimeUs() < best_us))
      best_us = v.getTimeUs();
    curve.push_back(best_us);
  }
  r.setBest(best());
  r.setCandidatesEvaluated(candidates);
  r.setEvaluations(evaluations);
  r.setCacheHits(hits);
  auto fl = r.initFailures(static_cast<unsigned>(failures.size()));
  unsigned k = 0;
  for (const auto& [cls, n] : failures) {
    fl[k].setFailureClass(cls);
    fl[k].setCount(n);
    ++k;
  }
  r.setUsage(const_cast<capnp::MallocMessageBuilder&>(usage_).getRoot<schema::Usage>().asReader());
  r.setStopReason(stop_reason);
  r.setRounds(rounds);
  r.setResumed(resumed_);
  auto c = r.initBestPerEvaluation(static_cast<unsigned>(curve.size()));
  for (unsigned i = 0; i < curve.size(); ++i)
    c.set(i, curve[i]);
  auto t = r.initTranscript(static_cast<unsigned>(transcript_.size()));
  for (unsigned i = 0; i < transcript_.size(); ++i)
    t.set(i, capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(transcript_[i].data()),
                                 transcript_[i].size()));
  return messages::encode(msg);
}

bool accepted(schema::Vertex::Reader v) {
  return v.getDecision().size() == 0 || v.getDecision() == "approved";
}

std::string search_key(schema::KernelSpec::Reader spec, schema::SearchSettings::Reader s) {
  // The spec's bytes stand for the task (read the same way, a spec gives the same bytes).
  auto key = fmt::format(
    "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}", messages::sha256_hex(messages::encode_root(spec)),
    s.getChip().cStr(), s.getMode().cStr(), s.getSeed(), s.getPolicy().cStr(),
    s.getBeamWidth(), s.getBranching(), s.getMaxRepairs());
  // Graph's rounds differ with and without dives; the other modes never dive.
  if (std::string_view(s.getMode().cStr()) == "graph")
    key += s.getDive() ? "\ndive" : "\nno dive";
  return messages::sha256_hex(key);
}

search::search_header search_header_for(schema::KernelSpec::Reader spec,
                                        schema::SearchSettings::Reader settings) {
  search::search_header header;
  header.key = search_key(spec, settings);
  header.task = spec.getName().cStr();
  header.mode = settings.getMode().cStr();
  header.chip = settings.getChip().cStr();
  header.spec_bytes = messages::encode_root(spec);
  header.settings_bytes = messages::encode_root(settings);
  return header;
}

}  // namespace maxkernel::actors
