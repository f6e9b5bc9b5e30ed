// One connection to a maxkernel SQLite database: the state directory's one file, which the
// evaluation store and the search graphs share, each as a component with its own tables and
// its own schema-version row in `meta`. Opening checks that the file is ours (PRAGMA
// application_id "MXKN"), puts it in WAL mode (retrying while another process creates it),
// and creates or checks the component's tables under one write lock. Internal to search/.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct sqlite3;
struct sqlite3_stmt;

namespace maxkernel::search {

struct database_component {
  const char* name;          // its row in `meta`
  const char* what;          // for messages: "evaluation store", "search graph"
  int version;               // its schema version
  const char* create_sql;    // its tables, created with the file's first use
  const char* always_sql;    // run on every open (tables added within a version), or nullptr
  const char* synchronous;   // PRAGMA synchronous: NORMAL or FULL
  const char* newer_hint;    // what to do with a file of a newer version
};

class sqlite_database {
public:
  // Refuses a directory, a file that is not a database or belongs to another application,
  // and another schema version of the component: nullptr with `error` naming the file.
  static std::unique_ptr<sqlite_database> open(const std::string& path,
                                               const database_component& component,
                                               std::string& error);
  ~sqlite_database();
  sqlite_database(const sqlite_database&) = delete;
  sqlite_database& operator=(const sqlite_database&) = delete;

  sqlite3* handle() const { return handle_; }
  // One connection, used by one thread at a time: its owner locks this around every use.
  std::mutex mutex;

  // SQL that returns no rows; false with `error`.
  bool exec(const char* sql, std::string& error);
  // The first column of the first row as text ("" when no row) or as an integer.
  bool query_text(const char* sql, std::string& out, std::string& error);
  bool query_int(const char* sql, int64_t& out, std::string& error);
  // A persistent statement, finalized with the connection.
  bool prepare(const char* sql, sqlite3_stmt*& st, std::string& error);
  // Steps a write statement to completion and resets it.
  bool run(sqlite3_stmt* st, std::string& error);
  // Ends a transaction begun with BEGIN IMMEDIATE: commits when ok, else rolls back.
  bool finish(bool ok, std::string& error);
  // SQLite's message for the last error of this connection (or for rc).
  std::string message(int rc) const;

  static constexpr int busy_timeout_ms = 15000;

private:
  sqlite_database() = default;
  bool use_wal(bool memory, std::string& error);
  bool check_and_create(const std::string& path, const database_component& c,
                        std::string& error);

  sqlite3* handle_ = nullptr;
  std::vector<sqlite3_stmt*> statements_;
};

}  // namespace maxkernel::search
