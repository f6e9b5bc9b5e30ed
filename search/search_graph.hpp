// The graph of one search, persisted in SQLite vertex by vertex as it grows, so that a killed
// search resumes without evaluating its finished vertices again. One file may hold several
// searches (one per key) and may be the state directory's database the evaluation store uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

struct sqlite3_stmt;

namespace maxkernel::messages {
class decoded_message;
}

namespace maxkernel::search {

// What identifies and describes a search.
struct search_header {
  std::string key;             // the search key (hex; the caller computes it from spec hash,
                               // chip, mode, seed, policy)
  std::string task;            // spec name
  std::string mode;            // auto | graph | hitl
  std::string chip;
  std::string spec_bytes;      // KernelSpec (capnp, messages::encode)
  std::string settings_bytes;  // SearchSettings (capnp)
};

class search_graph {
public:
  // Opens or creates the database (WAL, busy timeout, a schema version row). Refuses a file
  // that is not a database, belongs to another application or has another schema version of
  // the search graph tables: nullptr, with error naming the file.
  static std::unique_ptr<search_graph> open(const std::string& path, std::string& error);
  ~search_graph();
  search_graph(const search_graph&) = delete;
  search_graph& operator=(const search_graph&) = delete;

  // Starts the search header.key and makes it the current one. With resume, an existing search
  // of that key is kept and `resumed` set (its settings replaced by the new ones); without,
  // any existing search of that key is deleted first (vertices and edges). A resumed search
  // whose task, mode or chip differ from the header's is refused (the key should not allow it).
  bool begin(const search_header& header, bool resume, bool& resumed, std::string& error);
  // Inserts or replaces vertex `index` of the current search from encoded schema::Vertex
  // bytes: the bytes, its scalar columns and the edge from its parent. One transaction,
  // durable when it returns. Refuses bytes that do not decode and a parent that is not -1 or
  // an earlier index.
  bool put_vertex(const std::string& vertex_bytes, std::string& error);
  // Several vertices in one transaction (a graph round's children): all are stored, or none.
  bool put_vertices(const std::vector<std::string>& vertex_bytes, std::string& error);
  // The same for vertices the caller holds decoded already (decoded[k] is vertex_bytes[k],
  // checked by messages::decode or the caller's own encoding): not decoded a second time.
  bool put_decoded_vertices(const std::vector<std::string>& vertex_bytes,
                            std::vector<messages::decoded_message>& decoded, std::string& error);
  // What put_decoded_vertices checks before it writes: one decoded message per vertex, a
  // search is begun and every vertex fits (its parent -1 or an earlier vertex, its time a
  // time). error names the file.
  bool check_vertices(const std::vector<std::string>& vertex_bytes,
                      std::vector<messages::decoded_message>& decoded, std::string& error) const;
  // The current search's vertices (Vertex bytes), index order.
  std::vector<std::string> vertices(std::string& error) const;
  // Appends one entry (TranscriptEntry bytes, hitl's proposals and decisions) to the current
  // search's transcript; durable when it returns. A search begun anew starts an empty one.
  bool append_transcript(const std::string& entry_bytes, std::string& error);
  // The current search's transcript, in the order it was written.
  std::vector<std::string> transcript(std::string& error) const;
  // Writes a self-contained database holding only the current search (`--out
  // DIR/search.sqlite`) to out_path, replacing what was there. The copy opens as a
  // search_graph; it is left in rollback-journal mode so that it is one file.
  bool copy_to(const std::string& out_path, std::string& error) const;

  const std::string& path() const { return path_; }
  // The key of the search begun last; "" before begin().
  const std::string& current_key() const { return key_; }

  // The schema version of the search graph tables (their row in the `meta` table).
  static constexpr int schema_version = 1;

private:
  struct db;
  search_graph(std::unique_ptr<db> d, std::string path);
  // The blobs a one-parameter (search key) SELECT gives, in order.
  std::vector<std::string> rows(sqlite3_stmt* st, const char* what,
                                std::string& error) const;
  // The transaction of put_vertices, for vertices already checked (graph_writer's put
  // checks them when they are queued, and its thread stores them).
  friend class graph_writer;
  bool store_vertices(const std::vector<std::string>& vertex_bytes,
                      std::vector<messages::decoded_message>& decoded, std::string& error);
  std::unique_ptr<db> db_;
  std::string path_;
  std::string key_;
};

}  // namespace maxkernel::search
