#include "search/sqlite_database.hpp"

#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <system_error>
#include <thread>

namespace maxkernel::search {

namespace {

// PRAGMA application_id of a maxkernel database ("MXKN"): tells our file from other SQLite files.
constexpr int application_id = 0x4d584b4e;

bool busy(int rc) {
  int primary = rc & 0xff;
  return primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
}

}  // namespace

sqlite_database::~sqlite_database() {
  for (auto* st : statements_)
    sqlite3_finalize(st);
  sqlite3_close(handle_);
}

std::unique_ptr<sqlite_database> sqlite_database::open(const std::string& path,
                                                       const database_component& c,
                                                       std::string& error) {
  namespace fs = std::filesystem;
  error.clear();
  if (path.empty()) {
    error = std::string(c.what) + ": the path is empty";
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
      error = path + ": is a directory, not the " + c.what + "'s database file";
      return nullptr;
    }
  }
  std::unique_ptr<sqlite_database> d(new sqlite_database());
  int rc = sqlite3_open_v2(path.c_str(), &d->handle_,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  auto fail = [&](const std::string& what) {
    error = path + ": cannot open the " + c.what + ": " + what;
    return nullptr;
  };
  if (rc != SQLITE_OK)
    return fail(d->message(rc));
  sqlite3_extended_result_codes(d->handle_, 1);
  sqlite3_busy_timeout(d->handle_, busy_timeout_ms);
  // SQLite falls back to read-only on a write-protected file; both components write.
  if (sqlite3_db_readonly(d->handle_, "main") == 1)
    return fail("the file is not writable");
  std::string why;
  // The first statements read the file: a file that is not a database fails here.
  if (!d->use_wal(memory, why))
    return fail(why);
  std::string pragmas = std::string("PRAGMA synchronous = ") + c.synchronous +
                        "; PRAGMA foreign_keys = ON";
  if (!d->exec(pragmas.c_str(), why))
    return fail(why);
  // Created or checked under one write lock: two processes opening a new file at once do not
  // both create it.
  if (!d->exec("BEGIN IMMEDIATE", why))
    return fail(why);
  if (!d->finish(d->check_and_create(path, c, why), why)) {
    // check_and_create's own messages already name the path.
    error = why.rfind(path + ": ", 0) == 0 ? why
                                           : path + ": cannot open the " + c.what + ": " + why;
    return nullptr;
  }
  return d;
}

bool sqlite_database::exec(const char* sql, std::string& error) {
  char* msg = nullptr;
  int rc = sqlite3_exec(handle_, sql, nullptr, nullptr, &msg);
  if (rc != SQLITE_OK) {
    error = msg ? msg : sqlite3_errstr(rc);
    sqlite3_free(msg);
    return false;
  }
  return true;
}

bool sqlite_database::query_text(const char* sql, std::string& out, std::string& error) {
  sqlite3_stmt* st = nullptr;
  int rc = sqlite3_prepare_v2(handle_, sql, -1, &st, nullptr);
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
    error = message(rc);
  sqlite3_finalize(st);
  return rc == SQLITE_OK;
}

bool sqlite_database::query_int(const char* sql, int64_t& out, std::string& error) {
  sqlite3_stmt* st = nullptr;
  int rc = sqlite3_prepare_v2(handle_, sql, -1, &st, nullptr);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      out = sqlite3_column_int64(st, 0);
      rc = SQLITE_OK;
    }
  }
  if (rc != SQLITE_OK)
    error = message(rc);
  sqlite3_finalize(st);
  return rc == SQLITE_OK;
}

bool sqlite_database::prepare(const char* sql, sqlite3_stmt*& st, std::string& error) {
  int rc = sqlite3_prepare_v3(handle_, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr);
  if (rc != SQLITE_OK) {
    error = message(rc);
    return false;
  }
  statements_.push_back(st);
  return true;
}

bool sqlite_database::run(sqlite3_stmt* st, std::string& error) {
  int rc = sqlite3_step(st);
  if (rc != SQLITE_DONE)
    error = message(rc);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return rc == SQLITE_DONE;
}

bool sqlite_database::finish(bool ok, std::string& error) {
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

std::string sqlite_database::message(int rc) const {
  const char* m = handle_ ? sqlite3_errmsg(handle_) : nullptr;
  return m && *m ? m : sqlite3_errstr(rc);
}

// journal_mode=WAL takes an exclusive lock the busy handler does not wait for when another
// process is creating the same database: retry for as long as the busy timeout.
bool sqlite_database::use_wal(bool memory, std::string& error) {
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
    if (!busy(sqlite3_extended_errcode(handle_)) || std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool sqlite_database::check_and_create(const std::string& path, const database_component& c,
                                       std::string& error) {
  std::string what = c.what;
  int64_t app = 0, tables = 0, has_meta = 0;
  if (!query_int("PRAGMA application_id", app, error) ||
      !query_int("SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                 "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'", tables, error) ||
      !query_int("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                 has_meta, error))
    return false;
  if (app != 0 && app != application_id) {
    error = path + ": a SQLite database of another application (application_id " +
            std::to_string(app) + "), not a maxkernel " + what;
    return false;
  }
  if (app == 0 && tables > 0) {
    error = path + ": a SQLite database with tables of its own, not a maxkernel " + what;
    return false;
  }
  auto always = [&] { return !c.always_sql || exec(c.always_sql, error); };
  if (has_meta) {
    sqlite3_stmt* st = nullptr;
    int rc = sqlite3_prepare_v2(handle_, "SELECT schema_version FROM meta WHERE component = ?",
                                -1, &st, nullptr);
    if (rc == SQLITE_OK) {
      sqlite3_bind_text(st, 1, c.name, -1, SQLITE_STATIC);
      rc = sqlite3_step(st);
    }
    if (rc == SQLITE_ROW) {
      bool integer = sqlite3_column_type(st, 0) == SQLITE_INTEGER;
      int64_t version = sqlite3_column_int64(st, 0);
      sqlite3_finalize(st);
      if (!integer || version < 1) {
        error = path + ": the meta table's schema version of the " + what +
                " is not a version number";
        return false;
      }
      if (version > c.version) {
        error = path + ": the " + what + " has schema version " + std::to_string(version) +
                ", newer than this maxkernel's (" + std::to_string(c.version) + "); " +
                c.newer_hint;
        return false;
      }
      if (version < c.version) {
        // Version 1 is the first of both components: a later version migrates older ones
        // here, inside this write transaction.
        error = path + ": the " + what + " has schema version " + std::to_string(version) +
                ", which this maxkernel (version " + std::to_string(c.version) +
                ") cannot migrate";
        return false;
      }
      return always();
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
      error = message(rc);
      return false;
    }
    // meta written by another component of the same database: add ours below.
  }
  std::string set_id = "PRAGMA application_id = " + std::to_string(application_id);
  std::string insert_meta = std::string("INSERT INTO meta(component, schema_version) VALUES ('") +
                            c.name + "', " + std::to_string(c.version) + ")";
  return exec(c.create_sql, error) && always() && exec(set_id.c_str(), error) &&
         exec(insert_meta.c_str(), error);
}

}  // namespace maxkernel::search
