#include "search/evaluation_store.hpp"

#include "messages/version.hpp"

#include <sqlite3.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <thread>

namespace maxkernel::search {

namespace {

// Several node processes of one machine share the file; a write holds the lock for
// milliseconds, so a long wait means something is stuck rather than busy.
constexpr int busy_timeout_ms = 15000;
// PRAGMA application_id of a maxkernel database ("MXKN"): tells our file from other SQLite files.
constexpr int application_id = 0x4d584b4e;
// This store's row in `meta`; other stores of the same database (search graphs) add their own.
constexpr const char* component = "evaluations";

// Records are never updated or deleted: like TVM's measure logs, the table only grows, and
// each row says which store version and which maxkernel wrote it.
constexpr const char* create_sql = R"sql(
CREATE TABLE IF NOT EXISTS meta(
  component TEXT PRIMARY KEY NOT NULL,
  schema_version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS evaluations(
  key TEXT PRIMARY KEY NOT NULL,
  result BLOB NOT NULL,
  spec_name TEXT NOT NULL,
  chip TEXT NOT NULL,
  backend TEXT NOT NULL,
  correct INTEGER NOT NULL,
  time_us REAL,
  error_class TEXT NOT NULL,
  schema_version INTEGER NOT NULL,
  maxkernel_version TEXT NOT NULL,
  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));
)sql";

bool busy(int rc) {
  int primary = rc & 0xff;
  return primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
}

std::string message(sqlite3* h, int rc) {
  const char* m = h ? sqlite3_errmsg(h) : nullptr;
  return m && *m ? m : sqlite3_errstr(rc);
}

}  // namespace

struct evaluation_store::db {
  sqlite3* handle = nullptr;
  sqlite3_stmt* find = nullptr;
  sqlite3_stmt* insert = nullptr;
  sqlite3_stmt* count = nullptr;
  std::mutex mutex;  // one connection, used by one thread at a time
  std::string last_error;

  ~db() {
    sqlite3_finalize(find);
    sqlite3_finalize(insert);
    sqlite3_finalize(count);
    sqlite3_close(handle);
  }

  // Runs SQL that returns no rows; on failure sets error and returns false.
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

  // The first column of the first row of sql as text ("" if no row); false on an error.
  bool query_text(const char* sql, std::string& out, std::string& error) {
    sqlite3_stmt* st = nullptr;
    int rc = sqlite3_prepare_v2(handle, sql, -1, &st, nullptr);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(st);
      if (rc == SQLITE_ROW) {
        auto text = sqlite3_column_text(st, 0);
        out = text ? reinterpret_cast<const char*>(text) : "";
        rc = SQLITE_OK;
      } else if (rc == SQLITE_DONE) {
        out.clear();
        rc = SQLITE_OK;
      }
    }
    if (rc != SQLITE_OK)
      error = message(handle, rc);
    sqlite3_finalize(st);
    return rc == SQLITE_OK;
  }

  bool query_int(const char* sql, int64_t& out, std::string& error) {
    sqlite3_stmt* st = nullptr;
    int rc = sqlite3_prepare_v2(handle, sql, -1, &st, nullptr);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(st);
      if (rc == SQLITE_ROW) {
        out = sqlite3_column_int64(st, 0);
        rc = SQLITE_OK;
      }
    }
    if (rc != SQLITE_OK)
      error = message(handle, rc);
    sqlite3_finalize(st);
    return rc == SQLITE_OK;
  }

  bool prepare(const char* sql, sqlite3_stmt*& st, std::string& error) {
    int rc = sqlite3_prepare_v3(handle, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr);
    if (rc != SQLITE_OK)
      error = message(handle, rc);
    return rc == SQLITE_OK;
  }

  // journal_mode=WAL takes an exclusive lock, which the busy handler does not wait for when
  // another process is creating the same database: retry for as long as the busy timeout.
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

  // Creates or checks the tables under one write lock, so two processes opening a new file at
  // once do not both create it.
  bool set_up_schema(const std::string& path, std::string& error) {
    if (!exec("BEGIN IMMEDIATE", error))
      return false;
    bool ok = check_and_create(path, error);
    std::string ignored;
    if (!exec(ok ? "COMMIT" : "ROLLBACK", ok ? error : ignored))
      ok = false;
    return ok;
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
              std::to_string(app) + "), not a maxkernel evaluation store";
      return false;
    }
    if (app == 0 && tables > 0) {
      error = path + ": a SQLite database with tables of its own, not a maxkernel evaluation store";
      return false;
    }
    if (has_meta) {
      sqlite3_stmt* st = nullptr;
      int rc = sqlite3_prepare_v2(handle, "SELECT schema_version FROM meta WHERE component = ?",
                                  -1, &st, nullptr);
      if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, component, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
      }
      if (rc == SQLITE_ROW) {
        bool integer = sqlite3_column_type(st, 0) == SQLITE_INTEGER;
        int64_t version = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        if (!integer || version < 1) {
          error = path + ": the meta table's schema version of the evaluation store is not a "
                         "version number";
          return false;
        }
        if (version > schema_version) {
          error = path + ": the evaluation store has schema version " + std::to_string(version) +
                  ", newer than this maxkernel's (" + std::to_string(schema_version) +
                  "); use a newer maxkernel or another state directory";
          return false;
        }
        if (version < schema_version)
          return migrate(path, version, error);
        return true;
      }
      sqlite3_finalize(st);
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
    return exec(create_sql, error) && exec(set_id.c_str(), error) &&
           exec(insert_meta.c_str(), error);
  }

  // Version 1 is the first: there is nothing older to migrate yet. A later version adds a step
  // per older version here, inside the open's write transaction.
  bool migrate(const std::string& path, int64_t version, std::string& error) {
    error = path + ": the evaluation store has schema version " + std::to_string(version) +
            ", which this maxkernel (version " + std::to_string(schema_version) +
            ") cannot migrate";
    return false;
  }
};

std::unique_ptr<evaluation_store> evaluation_store::open(const std::string& path,
                                                         std::string& error) {
  namespace fs = std::filesystem;
  error.clear();
  if (path.empty()) {
    error = "evaluation store: the path is empty";
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
      error = path + ": is a directory, not an evaluation store file";
      return nullptr;
    }
  }

  auto d = std::make_unique<db>();
  int rc = sqlite3_open_v2(path.c_str(), &d->handle,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  auto fail = [&](const std::string& what) {
    error = path + ": cannot open the evaluation store: " + what;
    return nullptr;
  };
  if (rc != SQLITE_OK)
    return fail(message(d->handle, rc));
  sqlite3_extended_result_codes(d->handle, 1);
  sqlite3_busy_timeout(d->handle, busy_timeout_ms);
  // SQLite falls back to read-only on a write-protected file; the store must write.
  if (sqlite3_db_readonly(d->handle, "main") == 1)
    return fail("the file is not writable");
  std::string why;
  // The first statements read the file: a file that is not a database fails here.
  if (!d->use_wal(memory, why))
    return fail(why);
  if (!d->exec("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON", why))
    return fail(why);
  if (!d->set_up_schema(path, why)) {
    // set_up_schema's own messages already name the path.
    error = why.rfind(path + ": ", 0) == 0 ? why : path + ": cannot open the evaluation store: " + why;
    return nullptr;
  }
  if (!d->prepare("SELECT result FROM evaluations WHERE key = ?", d->find, why) ||
      !d->prepare("INSERT OR IGNORE INTO evaluations(key, result, spec_name, chip, backend, "
                  "correct, time_us, error_class, schema_version, maxkernel_version) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  d->insert, why) ||
      !d->prepare("SELECT count(*) FROM evaluations", d->count, why))
    return fail(why);
  return std::unique_ptr<evaluation_store>(new evaluation_store(std::move(d), path));
}

evaluation_store::evaluation_store(std::unique_ptr<db> d, std::string path)
    : db_(std::move(d)), path_(std::move(path)) {}

evaluation_store::~evaluation_store() = default;

std::optional<std::string> evaluation_store::find(const std::string& key) {
  std::lock_guard lock(db_->mutex);
  sqlite3_stmt* st = db_->find;
  sqlite3_bind_text(st, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
  int rc = sqlite3_step(st);
  std::optional<std::string> out;
  if (rc == SQLITE_ROW) {
    auto bytes = static_cast<const char*>(sqlite3_column_blob(st, 0));
    out.emplace(bytes ? bytes : "", static_cast<size_t>(sqlite3_column_bytes(st, 0)));
  } else if (rc != SQLITE_DONE) {
    db_->last_error = path_ + ": cannot look up an evaluation: " + message(db_->handle, rc);
  }
  // Reset at once: a statement left open would hold a read snapshot of the WAL.
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  ++(out ? hits_ : misses_);
  return out;
}

bool evaluation_store::record(const evaluation_record& r, std::string& error) {
  if (r.key.empty()) {
    error = path_ + ": cannot record an evaluation without a key";
    return false;
  }
  if (!std::isfinite(r.time_us) || r.time_us < 0) {
    error = path_ + ": cannot record evaluation " + r.key + ": time_us " +
            std::to_string(r.time_us) + " is not a time";
    return false;
  }
  static const std::string version = messages::maxkernel_version();
  std::lock_guard lock(db_->mutex);
  sqlite3_stmt* st = db_->insert;
  auto text = [&](int i, const std::string& s) {
    sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_STATIC);
  };
  text(1, r.key);
  sqlite3_bind_blob(st, 2, r.result.data(), static_cast<int>(r.result.size()), SQLITE_STATIC);
  text(3, r.spec_name);
  text(4, r.chip);
  text(5, r.backend);
  sqlite3_bind_int(st, 6, r.correct ? 1 : 0);
  if (r.time_us > 0)  // untimed is NULL, so averages in SQL skip it
    sqlite3_bind_double(st, 7, r.time_us);
  else
    sqlite3_bind_null(st, 7);
  text(8, r.error_class);
  sqlite3_bind_int(st, 9, schema_version);
  text(10, version);
  int rc = sqlite3_step(st);
  if (rc != SQLITE_DONE)
    error = path_ + ": cannot record evaluation " + r.key + ": " + message(db_->handle, rc);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return rc == SQLITE_DONE;
}

uint64_t evaluation_store::size() {
  std::lock_guard lock(db_->mutex);
  sqlite3_stmt* st = db_->count;
  int rc = sqlite3_step(st);
  uint64_t n = 0;
  if (rc == SQLITE_ROW)
    n = static_cast<uint64_t>(sqlite3_column_int64(st, 0));
  else
    db_->last_error = path_ + ": cannot count evaluations: " + message(db_->handle, rc);
  sqlite3_reset(st);
  return n;
}

std::string evaluation_store::last_error() const {
  std::lock_guard lock(db_->mutex);
  return db_->last_error;
}

}  // namespace maxkernel::search
