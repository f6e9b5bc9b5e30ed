#include "search/search_graph.hpp"

#include "messages/capnp_io.hpp"
#include "messages/version.hpp"
#include "search/sqlite_database.hpp"

#include <maxkernel/schema/search.capnp.h>
#include <sqlite3.h>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <tuple>

namespace maxkernel::search {

namespace {


// Vertices and edges belong to their search; deleting a search deletes them (begin without
// resume deletes them explicitly too, so nothing depends on the foreign_keys pragma).
constexpr const char* create_sql = R"sql(
CREATE TABLE IF NOT EXISTS meta(
  component TEXT PRIMARY KEY NOT NULL,
  schema_version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS searches(
  key TEXT PRIMARY KEY NOT NULL,
  task TEXT NOT NULL,
  mode TEXT NOT NULL,
  chip TEXT NOT NULL,
  spec BLOB NOT NULL,
  settings BLOB NOT NULL,
  maxkernel_version TEXT NOT NULL,
  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));
CREATE TABLE IF NOT EXISTS vertices(
  search_key TEXT NOT NULL REFERENCES searches(key) ON DELETE CASCADE,
  idx INTEGER NOT NULL,
  parent INTEGER NOT NULL,
  strategy TEXT NOT NULL,
  round INTEGER NOT NULL,
  state TEXT NOT NULL,
  correct INTEGER NOT NULL,
  time_us REAL,
  candidate_id TEXT NOT NULL,
  template TEXT NOT NULL,
  failure_class TEXT NOT NULL,
  bytes BLOB NOT NULL,
  PRIMARY KEY (search_key, idx));
CREATE TABLE IF NOT EXISTS edges(
  search_key TEXT NOT NULL REFERENCES searches(key) ON DELETE CASCADE,
  parent INTEGER NOT NULL,
  child INTEGER NOT NULL,
  strategy TEXT NOT NULL,
  PRIMARY KEY (search_key, child));
)sql";

// hitl's transcript (TranscriptEntry bytes in order). Added to version 1 files as they open:
// a file without it is an older file of the same version, not another format.
constexpr const char* transcript_sql = R"sql(
CREATE TABLE IF NOT EXISTS transcript(
  search_key TEXT NOT NULL REFERENCES searches(key) ON DELETE CASCADE,
  n INTEGER NOT NULL,
  at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  bytes BLOB NOT NULL,
  PRIMARY KEY (search_key, n));
)sql";

constexpr const char* vertex_columns =
    "search_key, idx, parent, strategy, round, state, correct, time_us, candidate_id, template, "
    "failure_class, bytes";
constexpr const char* search_columns =
    "key, task, mode, chip, spec, settings, maxkernel_version, created_at, updated_at";

const char* state_name(schema::VertexState s) {
  switch (s) {
    case schema::VertexState::PENDING: return "pending";
    case schema::VertexState::EVALUATED: return "evaluated";
    case schema::VertexState::FAILED: return "failed";
  }
  return "unknown";
}

// A prepared statement finalized with its scope.
struct statement {
  sqlite3_stmt* st = nullptr;
  ~statement() { sqlite3_finalize(st); }
  void text(int i, const std::string& s) {
    sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void blob(int i, const std::string& s) {
    sqlite3_bind_blob(st, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
};

// Removes a database file and its WAL companions; false with error when one cannot go.
bool remove_database_files(const std::string& path, std::string& error) {
  namespace fs = std::filesystem;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::error_code ec;
    fs::remove(path + suffix, ec);
    if (ec) {
      error = path + suffix + ": cannot remove it to write the copy: " + ec.message();
      return false;
    }
  }
  return true;
}

// The search graph's tables in the state directory's database. FULL: a vertex is durable when
// put_vertex returns, even across a power cut (one fsync of the WAL per vertex, next to seconds
// of evaluation per vertex).
const database_component graph_component{
  "search_graph", "search graph", search_graph::schema_version, create_sql, transcript_sql,
  "FULL", "use a newer maxkernel or another file"};

}  // namespace

struct search_graph::db {
  std::unique_ptr<sqlite_database> conn;
  sqlite3_stmt* put_vertex = nullptr;
  sqlite3_stmt* put_edge = nullptr;
  sqlite3_stmt* drop_edge = nullptr;
  sqlite3_stmt* touch = nullptr;
  sqlite3_stmt* list = nullptr;
  sqlite3_stmt* append_entry = nullptr;
  sqlite3_stmt* list_entries = nullptr;
};

std::unique_ptr<search_graph> search_graph::open(const std::string& path, std::string& error) {
  auto d = std::make_unique<db>();
  d->conn = sqlite_database::open(path, graph_component, error);
  if (!d->conn)
    return nullptr;
  std::string why;
  auto fail = [&](const std::string& what) {
    error = path + ": cannot open the search graph: " + what;
    return nullptr;
  };
  std::string put_vertex = std::string("INSERT OR REPLACE INTO vertices(") + vertex_columns +
                           ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
  if (!d->conn->prepare(put_vertex.c_str(), d->put_vertex, why) ||
      !d->conn->prepare("INSERT OR REPLACE INTO edges(search_key, parent, child, strategy) "
                  "VALUES (?, ?, ?, ?)", d->put_edge, why) ||
      !d->conn->prepare("DELETE FROM edges WHERE search_key = ? AND child = ?", d->drop_edge, why) ||
      !d->conn->prepare("UPDATE searches SET updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
                  "WHERE key = ?", d->touch, why) ||
      !d->conn->prepare("SELECT bytes FROM vertices WHERE search_key = ? ORDER BY idx", d->list, why) ||
      !d->conn->prepare("INSERT INTO transcript(search_key, n, bytes) SELECT ?1, "
                  "coalesce(max(n) + 1, 0), ?2 FROM transcript WHERE search_key = ?1",
                  d->append_entry, why) ||
      !d->conn->prepare("SELECT bytes FROM transcript WHERE search_key = ? ORDER BY n", d->list_entries,
                  why))
    return fail(why);
  return std::unique_ptr<search_graph>(new search_graph(std::move(d), path));
}

search_graph::search_graph(std::unique_ptr<db> d, std::string path)
    : db_(std::move(d)), path_(std::move(path)) {}

search_graph::~search_graph() = default;

bool search_graph::begin(const search_header& h, bool resume, bool& resumed, std::string& error) {
  resumed = false;
  if (h.key.empty()) {
    error = path_ + ": cannot begin a search without a key";
    return false;
  }
  std::lock_guard lock(db_->conn->mutex);
  std::string why;
  auto fail = [&] {
    error = path_ + ": cannot begin search " + h.key + ": " + why;
    return false;
  };
  if (!db_->conn->exec("BEGIN IMMEDIATE", why))
    return fail();
  // Reads the existing row, if any, inside the write lock.
  bool exists = false, ok = true;
  {
    statement s;
    int rc = sqlite3_prepare_v2(db_->conn->handle(), "SELECT task, mode, chip FROM searches WHERE key = ?",
                                -1, &s.st, nullptr);
    if (rc == SQLITE_OK) {
      s.text(1, h.key);
      rc = sqlite3_step(s.st);
    }
    if (rc == SQLITE_ROW) {
      exists = true;
      auto col = [&](int i) {
        auto t = sqlite3_column_text(s.st, i);
        return std::string(t ? reinterpret_cast<const char*>(t) : "");
      };
      std::string task = col(0), mode = col(1), chip = col(2);
      if (resume && (task != h.task || mode != h.mode || chip != h.chip)) {
        why = "the file holds this key for task '" + task + "', mode '" + mode + "', chip '" +
              chip + "', not task '" + h.task + "', mode '" + h.mode + "', chip '" + h.chip +
              "'";
        ok = false;
      }
    } else if (rc != SQLITE_DONE) {
      why = db_->conn->message(rc);
      ok = false;
    }
  }
  auto run = [&](const char* sql, bool with_blobs) {
    if (!ok)
      return;
    statement s;
    int rc = sqlite3_prepare_v2(db_->conn->handle(), sql, -1, &s.st, nullptr);
    if (rc == SQLITE_OK) {
      static const std::string version = messages::maxkernel_version();
      s.text(1, h.key);
      if (with_blobs) {
        s.text(2, h.task);
        s.text(3, h.mode);
        s.text(4, h.chip);
        s.blob(5, h.spec_bytes);
        s.blob(6, h.settings_bytes);
        s.text(7, version);
      }
      rc = sqlite3_step(s.st);
    }
    if (rc != SQLITE_DONE) {
      why = db_->conn->message(rc);
      ok = false;
    }
  };
  if (exists && resume) {
    // The settings may differ (a larger budget); ?2-?5 are bound but unused by this statement.
    run("UPDATE searches SET settings = ?6, maxkernel_version = ?7, "
        "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE key = ?1", true);
  } else {
    if (exists) {
      run("DELETE FROM transcript WHERE search_key = ?1", false);
      run("DELETE FROM edges WHERE search_key = ?1", false);
      run("DELETE FROM vertices WHERE search_key = ?1", false);
      run("DELETE FROM searches WHERE key = ?1", false);
    }
    run("INSERT INTO searches(key, task, mode, chip, spec, settings, maxkernel_version) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)", true);
  }
  if (!db_->conn->finish(ok, why))
    return fail();
  resumed = exists && resume;
  key_ = h.key;
  return true;
}

namespace {
// What a stored vertex must satisfy besides decoding: error names the file, search and vertex.
bool vertex_fits(const std::string& path, const std::string& key, schema::Vertex::Reader v,
                 std::string& error) {
  int64_t index = v.getIndex();
  int64_t parent = v.getParent();
  auto fail = [&](const std::string& what) {
    error = path + ": search " + key + ": cannot store vertex " + std::to_string(index) + ": " +
            what;
    return false;
  };
  // Creation order: a parent exists before its children, so it has a lower index.
  if (parent < -1 || parent >= index)
    return fail("its parent " + std::to_string(parent) + " is neither -1 nor an earlier vertex");
  double time_us = v.getTimeUs();
  if (!std::isfinite(time_us) || time_us < 0)
    return fail("timeUs " + std::to_string(time_us) + " is not a time");
  return true;
}
}  // namespace

bool search_graph::put_vertex(const std::string& bytes, std::string& error) {
  return put_vertices({bytes}, error);
}

bool search_graph::put_vertices(const std::vector<std::string>& all, std::string& error) {
  if (key_.empty()) {
    error = path_ + ": cannot store a vertex before a search is begun";
    return false;
  }
  // Every vertex is checked before the transaction: all are stored, or none.
  std::vector<messages::decoded_message> decoded;
  for (const auto& bytes : all) {
    std::string why;
    auto msg = messages::decode<schema::Vertex>(bytes, why);
    if (!msg) {
      error = path_ + ": search " + key_ + ": cannot store a vertex: the bytes are not a Vertex: " +
              why;
      return false;
    }
    if (!vertex_fits(path_, key_, msg->root<schema::Vertex>(), error))
      return false;
    decoded.push_back(std::move(*msg));
  }
  return store_vertices(all, decoded, error);
}

bool search_graph::put_decoded_vertices(const std::vector<std::string>& all,
                                        std::vector<messages::decoded_message>& decoded,
                                        std::string& error) {
  return check_vertices(all, decoded, error) && store_vertices(all, decoded, error);
}

bool search_graph::check_vertices(const std::vector<std::string>& all,
                                  std::vector<messages::decoded_message>& decoded,
                                  std::string& error) const {
  if (decoded.size() != all.size()) {
    error = path_ + ": search " + key_ + ": " + std::to_string(decoded.size()) +
            " decoded vertices for " + std::to_string(all.size());
    return false;
  }
  if (key_.empty()) {
    error = path_ + ": cannot store a vertex before a search is begun";
    return false;
  }
  for (auto& msg : decoded)
    if (!vertex_fits(path_, key_, msg.root<schema::Vertex>(), error))
      return false;
  return true;
}

bool search_graph::store_vertices(const std::vector<std::string>& all,
                                  std::vector<messages::decoded_message>& decoded,
                                  std::string& error) {
  std::lock_guard lock(db_->conn->mutex);
  std::string why;
  if (!db_->conn->exec("BEGIN IMMEDIATE", why)) {
    error = path_ + ": search " + key_ + ": cannot store vertices: " + why;
    return false;
  }
  auto text = [&](sqlite3_stmt* s, int i, const std::string& t) {
    sqlite3_bind_text(s, i, t.data(), static_cast<int>(t.size()), SQLITE_TRANSIENT);
  };
  bool ok = true;
  int64_t index = 0;
  for (size_t k = 0; ok && k < all.size(); ++k) {
    auto v = decoded[k].root<schema::Vertex>();
    index = v.getIndex();
    int64_t parent = v.getParent();
    double time_us = v.getTimeUs();
    std::string strategy = v.getStrategy();
    auto candidate = v.getCandidate();
    const std::string& bytes = all[k];
    sqlite3_stmt* st = db_->put_vertex;
    text(st, 1, key_);
    sqlite3_bind_int64(st, 2, index);
    sqlite3_bind_int64(st, 3, parent);
    text(st, 4, strategy);
    sqlite3_bind_int64(st, 5, v.getRound());
    sqlite3_bind_text(st, 6, state_name(v.getState()), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 7, v.getCorrect() ? 1 : 0);
    if (time_us > 0)  // untimed is NULL, as in the evaluation store
      sqlite3_bind_double(st, 8, time_us);
    else
      sqlite3_bind_null(st, 8);
    text(st, 9, candidate.getId());
    text(st, 10, candidate.getTemplate());
    text(st, 11, v.getFailureClass());
    sqlite3_bind_blob(st, 12, bytes.data(), static_cast<int>(bytes.size()), SQLITE_STATIC);
    ok = db_->conn->run(st, why);
    if (ok && parent >= 0) {
      st = db_->put_edge;
      text(st, 1, key_);
      sqlite3_bind_int64(st, 2, parent);
      sqlite3_bind_int64(st, 3, index);
      text(st, 4, strategy);
      ok = db_->conn->run(st, why);
    } else if (ok) {
      // A replaced vertex that became a root loses its old edge.
      st = db_->drop_edge;
      text(st, 1, key_);
      sqlite3_bind_int64(st, 2, index);
      ok = db_->conn->run(st, why);
    }
  }
  if (ok) {
    text(db_->touch, 1, key_);
    ok = db_->conn->run(db_->touch, why);
  }
  if (!db_->conn->finish(ok, why)) {
    error = path_ + ": search " + key_ + ": cannot store vertex " + std::to_string(index) + ": " +
            why;
    return false;
  }
  return true;
}

bool search_graph::append_transcript(const std::string& entry_bytes, std::string& error) {
  if (key_.empty()) {
    error = path_ + ": cannot write the transcript before a search is begun";
    return false;
  }
  std::lock_guard lock(db_->conn->mutex);
  sqlite3_stmt* st = db_->append_entry;
  sqlite3_bind_text(st, 1, key_.data(), static_cast<int>(key_.size()), SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, entry_bytes.data(), static_cast<int>(entry_bytes.size()),
                    SQLITE_STATIC);
  std::string why;
  if (!db_->conn->run(st, why)) {
    error = path_ + ": search " + key_ + ": cannot write the transcript: " + why;
    return false;
  }
  return true;
}

std::vector<std::string> search_graph::vertices(std::string& error) const {
  return rows(db_->list, "vertices", error);
}

std::vector<std::string> search_graph::transcript(std::string& error) const {
  return rows(db_->list_entries, "the transcript", error);
}

std::vector<std::string> search_graph::rows(sqlite3_stmt* st, const char* what,
                                            std::string& error) const {
  std::vector<std::string> out;
  if (key_.empty()) {
    error = path_ + ": cannot list " + what + " before a search is begun";
    return out;
  }
  std::lock_guard lock(db_->conn->mutex);
  sqlite3_bind_text(st, 1, key_.data(), static_cast<int>(key_.size()), SQLITE_STATIC);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    auto bytes = static_cast<const char*>(sqlite3_column_blob(st, 0));
    out.emplace_back(bytes ? bytes : "", static_cast<size_t>(sqlite3_column_bytes(st, 0)));
  }
  if (rc != SQLITE_DONE) {
    error = path_ + ": search " + key_ + ": cannot list " + what + ": " +
            db_->conn->message(rc);
    out.clear();
  }
  // Reset at once: a statement left open would hold a read snapshot of the WAL.
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

bool search_graph::copy_to(const std::string& out_path, std::string& error) const {
  namespace fs = std::filesystem;
  if (key_.empty()) {
    error = path_ + ": cannot copy a search before one is begun";
    return false;
  }
  auto fail = [&](const std::string& what) {
    error = out_path + ": cannot copy search " + key_ + " of " + path_ + ": " + what;
    return false;
  };
  std::error_code ec;
  if (out_path.empty() || out_path == ":memory:")
    return fail("the copy needs a file path");
  if (path_ != ":memory:" && fs::exists(out_path, ec) && fs::equivalent(out_path, path_, ec))
    return fail("it is the search graph's own file");
  if (fs::is_directory(out_path, ec))
    return fail("is a directory");
  if (!remove_database_files(out_path, error))
    return false;
  {
    // Creates the copy's tables and meta row the way every search graph file gets them.
    std::string why;
    auto copy = open(out_path, why);
    if (!copy) {
      error = why;
      return false;
    }
  }
  std::lock_guard lock(db_->conn->mutex);
  std::string why;
  bool ok;
  {
    statement s;
    int rc = sqlite3_prepare_v2(db_->conn->handle(), "ATTACH DATABASE ? AS out_copy", -1, &s.st, nullptr);
    if (rc == SQLITE_OK) {
      s.text(1, out_path);
      rc = sqlite3_step(s.st);
    }
    ok = rc == SQLITE_DONE;
    if (!ok)
      why = db_->conn->message(rc);
  }
  if (!ok)
    return fail(why);
  ok = db_->conn->exec("BEGIN IMMEDIATE", why);
  for (auto [table, columns, key_column] :
       {std::tuple{"searches", search_columns, "key"},
        std::tuple{"vertices", vertex_columns, "search_key"},
        std::tuple{"edges", "search_key, parent, child, strategy", "search_key"},
        std::tuple{"transcript", "search_key, n, at, bytes", "search_key"}}) {
    if (!ok)
      break;
    std::string sql = std::string("INSERT INTO out_copy.") + table + "(" + columns + ") SELECT " +
                      columns + " FROM main." + table + " WHERE " + key_column + " = ?";
    statement s;
    int rc = sqlite3_prepare_v2(db_->conn->handle(), sql.c_str(), -1, &s.st, nullptr);
    if (rc == SQLITE_OK) {
      s.text(1, key_);
      rc = sqlite3_step(s.st);
    }
    if (rc != SQLITE_DONE) {
      why = db_->conn->message(rc);
      ok = false;
    }
  }
  ok = db_->conn->finish(ok, why);
  std::string detach_error;
  bool detached = db_->conn->exec("DETACH DATABASE out_copy", detach_error);
  if (!ok)
    return fail(why);
  if (!detached)
    return fail(detach_error);
  // One self-contained file: checkpoint the WAL into it and leave WAL mode.
  sqlite3* h = nullptr;
  int rc = sqlite3_open_v2(out_path.c_str(), &h, SQLITE_OPEN_READWRITE, nullptr);
  char* msg = nullptr;
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(h, sqlite_database::busy_timeout_ms);
    rc = sqlite3_exec(h, "PRAGMA journal_mode = DELETE", nullptr, nullptr, &msg);
  }
  if (rc != SQLITE_OK)
    why = msg ? msg : (h ? sqlite3_errmsg(h) : sqlite3_errstr(rc));
  sqlite3_free(msg);
  sqlite3_close(h);
  if (rc != SQLITE_OK)
    return fail(why);
  return true;
}

}  // namespace maxkernel::search
