#include "search/search_graph.hpp"

#include "messages/capnp_io.hpp"
#include "messages/version.hpp"

#include <maxkernel/schema/search.capnp.h>
#include <sqlite3.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <thread>
#include <tuple>

namespace maxkernel::search {

namespace {

// As the evaluation store's: writers hold the lock for milliseconds, so a long wait means
// something is stuck rather than busy.
constexpr int busy_timeout_ms = 15000;
// PRAGMA application_id of a maxkernel database ("MXKN"), shared with the evaluation store:
// both may live in the state directory's one database.
constexpr int application_id = 0x4d584b4e;
// Our row in `meta`; the evaluation store has its own.
constexpr const char* component = "search_graph";

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

bool busy(int rc) {
  int primary = rc & 0xff;
  return primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
}

std::string message(sqlite3* h, int rc) {
  const char* m = h ? sqlite3_errmsg(h) : nullptr;
  return m && *m ? m : sqlite3_errstr(rc);
}

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

}  // namespace

struct search_graph::db {
  sqlite3* handle = nullptr;
  sqlite3_stmt* put_vertex = nullptr;
  sqlite3_stmt* put_edge = nullptr;
  sqlite3_stmt* drop_edge = nullptr;
  sqlite3_stmt* touch = nullptr;
  sqlite3_stmt* list = nullptr;
  sqlite3_stmt* append_entry = nullptr;
  sqlite3_stmt* list_entries = nullptr;
  std::mutex mutex;  // one connection, used by one thread at a time

  ~db() {
    for (auto* st : {put_vertex, put_edge, drop_edge, touch, list, append_entry, list_entries})
      sqlite3_finalize(st);
    sqlite3_close(handle);
  }

  bool exec(const char* sql, std::string& error) {
    char* msg = nullptr;
    int rc = sqlite3_exec(handle, sql, nullptr, nullptr, &msg);
    if (rc != SQLITE_OK) {
      error = msg ? msg : sqlite3_errstr(rc);
      sqlite3_free(msg);
      return false;
    }
    return true;
  }

  bool query_text(const char* sql, std::string& out, std::string& error) {
    statement s;
    int rc = sqlite3_prepare_v2(handle, sql, -1, &s.st, nullptr);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(s.st);
      if (rc == SQLITE_ROW) {
        auto text = sqlite3_column_text(s.st, 0);
        out = text ? reinterpret_cast<const char*>(text) : "";
        rc = SQLITE_OK;
      } else if (rc == SQLITE_DONE) {
        out.clear();
        rc = SQLITE_OK;
      }
    }
    if (rc != SQLITE_OK)
      error = message(handle, rc);
    return rc == SQLITE_OK;
  }

  bool query_int(const char* sql, int64_t& out, std::string& error) {
    statement s;
    int rc = sqlite3_prepare_v2(handle, sql, -1, &s.st, nullptr);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(s.st);
      if (rc == SQLITE_ROW) {
        out = sqlite3_column_int64(s.st, 0);
        rc = SQLITE_OK;
      }
    }
    if (rc != SQLITE_OK)
      error = message(handle, rc);
    return rc == SQLITE_OK;
  }

  bool prepare(const char* sql, sqlite3_stmt*& st, std::string& error) {
    int rc = sqlite3_prepare_v3(handle, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr);
    if (rc != SQLITE_OK)
      error = message(handle, rc);
    return rc == SQLITE_OK;
  }

  // Steps a write statement to completion and resets it; false with error otherwise.
  bool run(sqlite3_stmt* st, std::string& error) {
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
      error = message(handle, rc);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE;
  }

  // Ends the transaction begun by BEGIN IMMEDIATE: commits when ok, else rolls back.
  bool finish(bool ok, std::string& error) {
    std::string ignored;
    if (!ok) {
      exec("ROLLBACK", ignored);
      return false;
    }
    if (exec("COMMIT", error))
      return true;
    exec("ROLLBACK", ignored);
    return false;
  }

  // journal_mode=WAL takes an exclusive lock the busy handler does not wait for when another
  // process is creating the same database: retry for as long as the busy timeout.
  bool use_wal(bool memory, std::string& error) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(busy_timeout_ms);
    for (;;) {
      std::string mode;
      if (query_text("PRAGMA journal_mode=WAL", mode, error)) {
        if (mode == "wal" || (memory && mode == "memory"))
          return true;
        error = "journal mode WAL is not available (SQLite left it at '" + mode +
                "'; is the file on a network file system?)";
        return false;
      }
      if (!busy(sqlite3_extended_errcode(handle)) || std::chrono::steady_clock::now() > deadline)
        return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Creates or checks the tables under one write lock, so that two processes opening a new
  // file at once do not both create it.
  bool set_up_schema(const std::string& path, std::string& error) {
    if (!exec("BEGIN IMMEDIATE", error))
      return false;
    return finish(check_and_create(path, error), error);
  }

  bool check_and_create(const std::string& path, std::string& error) {
    int64_t app = 0, tables = 0, has_meta = 0;
    if (!query_int("PRAGMA application_id", app, error) ||
        !query_int("SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                   "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'", tables, error) ||
        !query_int("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                   has_meta, error))
      return false;
    if (app != 0 && app != application_id) {
      error = path + ": a SQLite database of another application (application_id " +
              std::to_string(app) + "), not a maxkernel search graph";
      return false;
    }
    if (app == 0 && tables > 0) {
      error = path + ": a SQLite database with tables of its own, not a maxkernel search graph";
      return false;
    }
    if (has_meta) {
      statement s;
      int rc = sqlite3_prepare_v2(handle, "SELECT schema_version FROM meta WHERE component = ?",
                                  -1, &s.st, nullptr);
      if (rc == SQLITE_OK) {
        sqlite3_bind_text(s.st, 1, component, -1, SQLITE_STATIC);
        rc = sqlite3_step(s.st);
      }
      if (rc == SQLITE_ROW) {
        bool integer = sqlite3_column_type(s.st, 0) == SQLITE_INTEGER;
        int64_t version = sqlite3_column_int64(s.st, 0);
        if (!integer || version < 1) {
          error = path + ": the meta table's schema version of the search graph is not a "
                         "version number";
          return false;
        }
        if (version > schema_version) {
          error = path + ": the search graph has schema version " + std::to_string(version) +
                  ", newer than this maxkernel's (" + std::to_string(schema_version) +
                  "); use a newer maxkernel or another file";
          return false;
        }
        if (version < schema_version) {
          // Version 1 is the first; a later version migrates older ones here.
          error = path + ": the search graph has schema version " + std::to_string(version) +
                  ", which this maxkernel (version " + std::to_string(schema_version) +
                  ") cannot migrate";
          return false;
        }
        return exec(transcript_sql, error);
      }
      if (rc != SQLITE_DONE) {
        error = message(handle, rc);
        return false;
      }
      // meta written by another store of the same database: add ours below.
    }
    std::string set_id = "PRAGMA application_id = " + std::to_string(application_id);
    std::string insert_meta = "INSERT INTO meta(component, schema_version) VALUES ('" +
                              std::string(component) + "', " + std::to_string(schema_version) +
                              ")";
    return exec(create_sql, error) && exec(transcript_sql, error) &&
           exec(set_id.c_str(), error) && exec(insert_meta.c_str(), error);
  }
};

std::unique_ptr<search_graph> search_graph::open(const std::string& path, std::string& error) {
  namespace fs = std::filesystem;
  error.clear();
  if (path.empty()) {
    error = "search graph: the path is empty";
    return nullptr;
  }
  bool memory = path == ":memory:";
  if (!memory) {
    std::error_code ec;
    fs::path p(path);
    if (p.has_parent_path() && !fs::is_directory(p.parent_path(), ec)) {
      fs::create_directories(p.parent_path(), ec);
      if (ec) {
        error = path + ": cannot create the directory " + p.parent_path().string() + ": " +
                ec.message();
        return nullptr;
      }
    }
    if (fs::is_directory(p, ec)) {
      error = path + ": is a directory, not a search graph file";
      return nullptr;
    }
  }

  auto d = std::make_unique<db>();
  int rc = sqlite3_open_v2(path.c_str(), &d->handle,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  auto fail = [&](const std::string& what) {
    error = path + ": cannot open the search graph: " + what;
    return nullptr;
  };
  if (rc != SQLITE_OK)
    return fail(message(d->handle, rc));
  sqlite3_extended_result_codes(d->handle, 1);
  sqlite3_busy_timeout(d->handle, busy_timeout_ms);
  if (sqlite3_db_readonly(d->handle, "main") == 1)
    return fail("the file is not writable");
  std::string why;
  // The first statements read the file: a file that is not a database fails here.
  if (!d->use_wal(memory, why))
    return fail(why);
  // FULL: a vertex is durable when put_vertex returns, even across a power cut (one fsync of
  // the WAL per vertex, next to seconds of evaluation per vertex).
  if (!d->exec("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON", why))
    return fail(why);
  if (!d->set_up_schema(path, why)) {
    error = why.rfind(path + ": ", 0) == 0 ? why : path + ": cannot open the search graph: " + why;
    return nullptr;
  }
  std::string put_vertex = std::string("INSERT OR REPLACE INTO vertices(") + vertex_columns +
                           ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
  if (!d->prepare(put_vertex.c_str(), d->put_vertex, why) ||
      !d->prepare("INSERT OR REPLACE INTO edges(search_key, parent, child, strategy) "
                  "VALUES (?, ?, ?, ?)", d->put_edge, why) ||
      !d->prepare("DELETE FROM edges WHERE search_key = ? AND child = ?", d->drop_edge, why) ||
      !d->prepare("UPDATE searches SET updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
                  "WHERE key = ?", d->touch, why) ||
      !d->prepare("SELECT bytes FROM vertices WHERE search_key = ? ORDER BY idx", d->list, why) ||
      !d->prepare("INSERT INTO transcript(search_key, n, bytes) SELECT ?1, "
                  "coalesce(max(n) + 1, 0), ?2 FROM transcript WHERE search_key = ?1",
                  d->append_entry, why) ||
      !d->prepare("SELECT bytes FROM transcript WHERE search_key = ? ORDER BY n", d->list_entries,
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
  std::lock_guard lock(db_->mutex);
  std::string why;
  auto fail = [&] {
    error = path_ + ": cannot begin search " + h.key + ": " + why;
    return false;
  };
  if (!db_->exec("BEGIN IMMEDIATE", why))
    return fail();
  // Reads the existing row, if any, inside the write lock.
  bool exists = false, ok = true;
  {
    statement s;
    int rc = sqlite3_prepare_v2(db_->handle, "SELECT task, mode, chip FROM searches WHERE key = ?",
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
      why = message(db_->handle, rc);
      ok = false;
    }
  }
  auto run = [&](const char* sql, bool with_blobs) {
    if (!ok)
      return;
    statement s;
    int rc = sqlite3_prepare_v2(db_->handle, sql, -1, &s.st, nullptr);
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
      why = message(db_->handle, rc);
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
  if (!db_->finish(ok, why))
    return fail();
  resumed = exists && resume;
  key_ = h.key;
  return true;
}

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
    auto v = msg->root<schema::Vertex>();
    int64_t index = v.getIndex();
    int64_t parent = v.getParent();
    auto fail = [&](const std::string& what) {
      error = path_ + ": search " + key_ + ": cannot store vertex " + std::to_string(index) +
              ": " + what;
      return false;
    };
    // Creation order: a parent exists before its children, so it has a lower index.
    if (parent < -1 || parent >= index)
      return fail("its parent " + std::to_string(parent) + " is neither -1 nor an earlier vertex");
    double time_us = v.getTimeUs();
    if (!std::isfinite(time_us) || time_us < 0)
      return fail("timeUs " + std::to_string(time_us) + " is not a time");
    decoded.push_back(std::move(*msg));
  }

  std::lock_guard lock(db_->mutex);
  std::string why;
  if (!db_->exec("BEGIN IMMEDIATE", why)) {
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
    ok = db_->run(st, why);
    if (ok && parent >= 0) {
      st = db_->put_edge;
      text(st, 1, key_);
      sqlite3_bind_int64(st, 2, parent);
      sqlite3_bind_int64(st, 3, index);
      text(st, 4, strategy);
      ok = db_->run(st, why);
    } else if (ok) {
      // A replaced vertex that became a root loses its old edge.
      st = db_->drop_edge;
      text(st, 1, key_);
      sqlite3_bind_int64(st, 2, index);
      ok = db_->run(st, why);
    }
  }
  if (ok) {
    text(db_->touch, 1, key_);
    ok = db_->run(db_->touch, why);
  }
  if (!db_->finish(ok, why)) {
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
  std::lock_guard lock(db_->mutex);
  sqlite3_stmt* st = db_->append_entry;
  sqlite3_bind_text(st, 1, key_.data(), static_cast<int>(key_.size()), SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, entry_bytes.data(), static_cast<int>(entry_bytes.size()),
                    SQLITE_STATIC);
  std::string why;
  if (!db_->run(st, why)) {
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
  std::lock_guard lock(db_->mutex);
  sqlite3_bind_text(st, 1, key_.data(), static_cast<int>(key_.size()), SQLITE_STATIC);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    auto bytes = static_cast<const char*>(sqlite3_column_blob(st, 0));
    out.emplace_back(bytes ? bytes : "", static_cast<size_t>(sqlite3_column_bytes(st, 0)));
  }
  if (rc != SQLITE_DONE) {
    error = path_ + ": search " + key_ + ": cannot list " + what + ": " +
            message(db_->handle, rc);
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
  std::lock_guard lock(db_->mutex);
  std::string why;
  bool ok;
  {
    statement s;
    int rc = sqlite3_prepare_v2(db_->handle, "ATTACH DATABASE ? AS out_copy", -1, &s.st, nullptr);
    if (rc == SQLITE_OK) {
      s.text(1, out_path);
      rc = sqlite3_step(s.st);
    }
    ok = rc == SQLITE_DONE;
    if (!ok)
      why = message(db_->handle, rc);
  }
  if (!ok)
    return fail(why);
  ok = db_->exec("BEGIN IMMEDIATE", why);
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
    int rc = sqlite3_prepare_v2(db_->handle, sql.c_str(), -1, &s.st, nullptr);
    if (rc == SQLITE_OK) {
      s.text(1, key_);
      rc = sqlite3_step(s.st);
    }
    if (rc != SQLITE_DONE) {
      why = message(db_->handle, rc);
      ok = false;
    }
  }
  ok = db_->finish(ok, why);
  std::string detach_error;
  bool detached = db_->exec("DETACH DATABASE out_copy", detach_error);
  if (!ok)
    return fail(why);
  if (!detached)
    return fail(detach_error);
  // One self-contained file: checkpoint the WAL into it and leave WAL mode.
  sqlite3* h = nullptr;
  int rc = sqlite3_open_v2(out_path.c_str(), &h, SQLITE_OPEN_READWRITE, nullptr);
  char* msg = nullptr;
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(h, busy_timeout_ms);
    rc = sqlite3_exec(h, "PRAGMA journal_mode = DELETE", nullptr, nullptr, &msg);
  }
  if (rc != SQLITE_OK)
    why = msg ? msg : message(h, rc);
  sqlite3_free(msg);
  sqlite3_close(h);
  if (rc != SQLITE_OK)
    return fail(why);
  return true;
}

}  // namespace maxkernel::search
