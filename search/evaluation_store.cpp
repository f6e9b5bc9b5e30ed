#include "search/evaluation_store.hpp"

#include "messages/version.hpp"
#include "search/sqlite_database.hpp"

#include <sqlite3.h>

#include <cmath>
#include <mutex>

namespace maxkernel::search {

namespace {

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

// Several node processes of one machine share the file (a write holds the lock for
// milliseconds); NORMAL: a power cut may lose the last evaluations, which are only a cache.
const database_component store_component{
  "evaluations", "evaluation store", evaluation_store::schema_version, create_sql, nullptr,
  "NORMAL", "use a newer maxkernel or another state directory"};

}  // namespace

struct evaluation_store::db {
  std::unique_ptr<sqlite_database> conn;
  sqlite3_stmt* find = nullptr;
  sqlite3_stmt* insert = nullptr;
  sqlite3_stmt* count = nullptr;
  std::string last_error;
};

std::unique_ptr<evaluation_store> evaluation_store::open(const std::string& path,
                                                         std::string& error) {
  auto d = std::make_unique<db>();
  d->conn = sqlite_database::open(path, store_component, error);
  if (!d->conn)
    return nullptr;
  std::string why;
  if (!d->conn->prepare("SELECT result FROM evaluations WHERE key = ?", d->find, why) ||
      !d->conn->prepare("INSERT OR IGNORE INTO evaluations(key, result, spec_name, chip, "
                        "backend, correct, time_us, error_class, schema_version, "
                        "maxkernel_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        d->insert, why) ||
      !d->conn->prepare("SELECT count(*) FROM evaluations", d->count, why)) {
    error = path + ": cannot open the evaluation store: " + why;
    return nullptr;
  }
  return std::unique_ptr<evaluation_store>(new evaluation_store(std::move(d), path));
}

evaluation_store::evaluation_store(std::unique_ptr<db> d, std::string path)
    : db_(std::move(d)), path_(std::move(path)) {}

evaluation_store::~evaluation_store() = default;

std::optional<std::string> evaluation_store::find(const std::string& key) {
  std::lock_guard lock(db_->conn->mutex);
  sqlite3_stmt* st = db_->find;
  sqlite3_bind_text(st, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
  int rc = sqlite3_step(st);
  std::optional<std::string> out;
  if (rc == SQLITE_ROW) {
    auto bytes = static_cast<const char*>(sqlite3_column_blob(st, 0));
    out.emplace(bytes ? bytes : "", static_cast<size_t>(sqlite3_column_bytes(st, 0)));
  } else if (rc != SQLITE_DONE) {
    db_->last_error = path_ + ": cannot look up an evaluation: " + db_->conn->message(rc);
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
  std::lock_guard lock(db_->conn->mutex);
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
    error = path_ + ": cannot record evaluation " + r.key + ": " + db_->conn->message(rc);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return rc == SQLITE_DONE;
}

uint64_t evaluation_store::size() {
  std::lock_guard lock(db_->conn->mutex);
  sqlite3_stmt* st = db_->count;
  int rc = sqlite3_step(st);
  uint64_t n = 0;
  if (rc == SQLITE_ROW)
    n = static_cast<uint64_t>(sqlite3_column_int64(st, 0));
  else
    db_->last_error = path_ + ": cannot count evaluations: " + db_->conn->message(rc);
  sqlite3_reset(st);
  return n;
}

std::string evaluation_store::last_error() const {
  std::lock_guard lock(db_->conn->mutex);
  return db_->last_error;
}

}  // namespace maxkernel::search
