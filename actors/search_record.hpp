// What a supervisor knows of its search: the vertices so far (in index order, as the Vertex
// messages search/search_graph persists), the best correct one, the curve of the best time
// per candidate, and the tallies that go into the OptimizeResult. Plain C++ (no actors), so
// the supervisors' bookkeeping is tested on its own. When a graph file is given, every
// change is written behind, in order (search::graph_writer): a killed search resumes from
// the prefix that was written, and flush makes all of it durable before a result.
#pragma once

#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/search.capnp.h"
#include "messages/capnp_io.hpp"
#include "search/graph_writer.hpp"
#include "search/search_graph.hpp"

#include <capnp/message.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace maxkernel::actors {

class search_record {
public:
  search_record();
  ~search_record();
  search_record(const search_record&) = delete;
  search_record& operator=(const search_record&) = delete;

  // Opens `graph_path` (none when empty) and starts the search of this spec and settings
  // there (search_header_for); an existing search of that key is resumed (its vertices
  // loaded) when `resume`, else replaced.
  bool open(const std::string& graph_path, schema::KernelSpec::Reader spec,
            schema::SearchSettings::Reader settings, bool resume, std::string& error);
  bool resumed() const { return resumed_; }

  // Adds or replaces vertex v.getIndex() (index == size() appends); written behind.
  bool put(schema::Vertex::Reader v, std::string& error);
  // Adds or replaces several vertices (Vertex bytes) in one transaction of the graph file: a
  // round's children are all recorded, or none. False when they do not fit (nothing kept)
  // or when an earlier write to the graph file failed.
  bool put_all(const std::vector<std::string>& vertices, std::string& error);
  // Waits until everything put is in the graph file (durable); false with the first write
  // that failed. Before a result is delivered: the caller may copy the file then.
  bool flush(std::string& error);
  // Marks vertex i exhausted (the planner had no new move from it); written behind.
  bool mark_exhausted(size_t i, std::string& error);
  size_t size() const { return vertices_.size(); }
  schema::Vertex::Reader vertex(size_t i) const { return readers_[i]; }
  // Index of the first vertex whose candidate has this id; -1 when none.
  int find_candidate(const std::string& id) const;
  // Index of the first vertex that evaluated this candidate, as its result or as a kernel a
  // repair replaced (Vertex.triedIds); -1 when none. A step that yields it is not new.
  int find_tried(const std::string& id) const;

  // search::kernel_fingerprint of vertex i's structure when it is correct and timed; "" for
  // any other vertex. Computed on first asking (only graph's frontier asks) and kept until
  // the vertex is put again.
  const std::string& kernel_fingerprint(size_t i) const;

  // The fastest correct vertex (first on ties); -1 when none.
  int best() const;
  double best_time_us() const;
  // Candidates evaluated (vertices no longer pending).
  unsigned evaluated() const;

  // The planner's history: every evaluated vertex (one the operator did not accept marked
  // incorrect, so that it is no parent), and the operator's feedback and hints as guidance.
  // In full (source, structure, profile, diagnosis) only the best, the vertex of `parent_id`
  // and the last `full_recent` evaluated; the others slim (the candidate's id, template,
  // params and origin, the result's correctness and times): a request stays small however
  // large the graph grows.
  void fill_history(schema::PlannerRequest::Builder request,
                    const std::string& parent_id = "") const;
  static constexpr size_t full_recent = 8;

  // hitl's transcript (TranscriptEntry bytes): appended and written through, after what was
  // put before it; a resumed search's is loaded with it.
  bool append_transcript(const std::string& entry, std::string& error);
  const std::vector<std::string>& transcript() const { return transcript_; }

  void add_usage(schema::Usage::Reader u);

  // The whole search as an OptimizeResult.
  std::string result_bytes(const std::string& stop_reason, unsigned rounds) const;

private:
  // Kept up to date by put_all (each new vertex weighed; a full pass only when a vertex
  // changes its candidate or the best is replaced): read on every progress report and plan.
  void reindex();
  void weigh(size_t i);
  std::vector<messages::decoded_message> vertices_;
  // Each vertex's root, read once: a reader points into its message's words and reader,
  // which stay where they are when the message moves (both are on the heap).
  std::vector<schema::Vertex::Reader> readers_;
  std::unordered_map<std::string, size_t> first_of_id_;  // candidate id -> first vertex
  std::unordered_map<std::string, size_t> tried_of_id_;  // replaced by a repair -> vertex
  mutable std::vector<std::optional<std::string>> kernels_;  // per vertex, once asked
  int best_ = -1;
  unsigned evaluated_ = 0;
  std::vector<std::string> transcript_;
  std::unique_ptr<search::graph_writer> graph_;
  bool resumed_ = false;
  capnp::MallocMessageBuilder usage_;
};

// Whether a vertex may be the best or a plan's parent: everything in auto and graph; in hitl
// what the operator (or auto, when handed over) approved.
bool accepted(schema::Vertex::Reader v);

// The key a search is persisted under: the spec, chip, mode, seed and the graph policy
// settings (not the budgets: a resumed search may be given more).
std::string search_key(schema::KernelSpec::Reader spec, schema::SearchSettings::Reader s);
// How the search of this spec and settings is recorded in a graph file: its key, task, mode,
// chip and the spec and settings themselves.
search::search_header search_header_for(schema::KernelSpec::Reader spec,
                                        schema::SearchSettings::Reader settings);

}  // namespace maxkernel::actors
