// The evaluation store on real SQLite files: record, find, persistence, bad files.
#include "search/evaluation_store.hpp"

#include "temp_dir.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace maxkernel::search {
namespace {

using test::temp_dir;

evaluation_record make_record(const std::string& key, const std::string& result) {
  evaluation_record r;
  r.key = key;
  r.result = result;
  r.spec_name = "matmul";
  r.chip = "v5e";
  r.backend = "model";
  r.correct = true;
  r.time_us = 12.5;
  return r;
}

std::unique_ptr<evaluation_store> open_ok(const std::string& path) {
  std::string error;
  auto store = evaluation_store::open(path, error);
  EXPECT_TRUE(store) << error;
  EXPECT_EQ(error, "");
  return store;
}

// Runs SQL on a file directly, behind the store's back.
void raw_exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* msg = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg);
  EXPECT_EQ(rc, SQLITE_OK) << (msg ? msg : "");
  sqlite3_free(msg);
  sqlite3_close(db);
}

std::string raw_text(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string out = "<error>";
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      auto t = sqlite3_column_text(st, 0);
      out = t ? reinterpret_cast<const char*>(t) : "<null>";
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return out;
}

TEST(EvaluationStore, RecordThenFind) {
  temp_dir dir;
  auto store = open_ok(dir.file("evaluations.sqlite"));
  ASSERT_TRUE(store);
  std::string error;
  // Results are binary capnp: embedded zero bytes must survive.
  std::string bytes("\x00\x01result\x00\xff", 10);
  ASSERT_TRUE(store->record(make_record("k1", bytes), error)) << error;
  auto found = store->find("k1");
  ASSERT_TRUE(found);
  EXPECT_EQ(*found, bytes);
  EXPECT_FALSE(store->find("k2"));
  EXPECT_EQ(store->size(), 1u);
  EXPECT_EQ(store->last_error(), "");
}

TEST(EvaluationStore, RecordTwiceKeepsTheFirst) {
  temp_dir dir;
  auto store = open_ok(dir.file("evaluations.sqlite"));
  ASSERT_TRUE(store);
  std::string error;
  ASSERT_TRUE(store->record(make_record("k", "first"), error)) << error;
  auto second = make_record("k", "second");
  second.correct = false;
  EXPECT_TRUE(store->record(second, error)) << error;
  EXPECT_EQ(store->find("k"), "first");
  EXPECT_EQ(store->size(), 1u);
  EXPECT_EQ(raw_text(store->path(), "SELECT correct FROM evaluations WHERE key = 'k'"), "1");
}

TEST(EvaluationStore, CountsHitsAndMisses) {
  temp_dir dir;
  auto store = open_ok(dir.file("evaluations.sqlite"));
  ASSERT_TRUE(store);
  EXPECT_EQ(store->hits(), 0u);
  EXPECT_EQ(store->misses(), 0u);
  EXPECT_FALSE(store->find("a"));
  std::string error;
  ASSERT_TRUE(store->record(make_record("a", "r"), error)) << error;
  EXPECT_TRUE(store->find("a"));
  EXPECT_TRUE(store->find("a"));
  EXPECT_FALSE(store->find("b"));
  EXPECT_EQ(store->hits(), 2u);
  EXPECT_EQ(store->misses(), 2u);
}

TEST(EvaluationStore, RecordsTheQueryColumns) {
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  {
    auto store = open_ok(path);
    ASSERT_TRUE(store);
    auto r = make_record("bad", "r");
    r.correct = false;
    r.time_us = 0;
    r.error_class = "lowerError";
    std::string error;
    ASSERT_TRUE(store->record(r, error)) << error;
    ASSERT_TRUE(store->record(make_record("good", "r"), error)) << error;
  }
  EXPECT_EQ(raw_text(path, "SELECT spec_name || '|' || chip || '|' || backend || '|' || correct "
                           "|| '|' || error_class || '|' || (time_us IS NULL) "
                           "FROM evaluations WHERE key = 'bad'"),
            "matmul|v5e|model|0|lowerError|1");
  EXPECT_EQ(raw_text(path, "SELECT time_us FROM evaluations WHERE key = 'good'"), "12.5");
  EXPECT_EQ(raw_text(path, "SELECT schema_version FROM evaluations WHERE key = 'good'"),
            std::to_string(evaluation_store::schema_version));
  EXPECT_EQ(raw_text(path, "SELECT created_at LIKE '____-__-__T__:__:__.___Z' FROM evaluations "
                           "WHERE key = 'good'"),
            "1");
}

TEST(EvaluationStore, RefusesRecordsWithoutKeyOrWithABadTime) {
  temp_dir dir;
  auto store = open_ok(dir.file("evaluations.sqlite"));
  ASSERT_TRUE(store);
  std::string error;
  EXPECT_FALSE(store->record(make_record("", "r"), error));
  EXPECT_NE(error.find("without a key"), std::string::npos) << error;
  auto r = make_record("k", "r");
  r.time_us = -1;
  error.clear();
  EXPECT_FALSE(store->record(r, error));
  EXPECT_NE(error.find("time_us"), std::string::npos) << error;
  EXPECT_EQ(store->size(), 0u);
}

TEST(EvaluationStore, PersistsAcrossReopen) {
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  {
    auto store = open_ok(path);
    ASSERT_TRUE(store);
    std::string error;
    ASSERT_TRUE(store->record(make_record("k1", "one"), error)) << error;
    ASSERT_TRUE(store->record(make_record("k2", "two"), error)) << error;
  }
  auto store = open_ok(path);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->size(), 2u);
  EXPECT_EQ(store->find("k1"), "one");
  EXPECT_EQ(store->find("k2"), "two");
  // Counters belong to the store object, not the file.
  EXPECT_EQ(store->hits(), 2u);
  EXPECT_EQ(store->misses(), 0u);
}

TEST(EvaluationStore, CreatesParentDirectories) {
  temp_dir dir;
  std::string path = dir.file("a/b/c/evaluations.sqlite");
  auto store = open_ok(path);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->path(), path);
  EXPECT_TRUE(std::filesystem::is_regular_file(path));
}

TEST(EvaluationStore, FileIsWalWithMetaVersion) {
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  ASSERT_TRUE(open_ok(path));
  EXPECT_EQ(raw_text(path, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw_text(path, "SELECT schema_version FROM meta WHERE component = 'evaluations'"),
            std::to_string(evaluation_store::schema_version));
}

TEST(EvaluationStore, MemoryStoreWorks) {
  auto store = open_ok(":memory:");
  ASSERT_TRUE(store);
  std::string error;
  ASSERT_TRUE(store->record(make_record("k", "v"), error)) << error;
  EXPECT_EQ(store->find("k"), "v");
}

TEST(EvaluationStore, NewerSchemaVersionIsRefused) {
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  {
    auto store = open_ok(path);
    ASSERT_TRUE(store);
    std::string error;
    ASSERT_TRUE(store->record(make_record("k", "v"), error)) << error;
  }
  raw_exec(path, "UPDATE meta SET schema_version = 99 WHERE component = 'evaluations'");
  std::string error;
  auto store = evaluation_store::open(path, error);
  EXPECT_FALSE(store);
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("99"), std::string::npos) << error;
  EXPECT_NE(error.find("newer"), std::string::npos) << error;
  EXPECT_NE(error.find("(" + std::to_string(evaluation_store::schema_version) + ")"),
            std::string::npos)
      << error;
  // Refusing left the file alone.
  EXPECT_EQ(raw_text(path, "SELECT count(*) FROM evaluations"), "1");
}

TEST(EvaluationStore, UnusableSchemaVersionIsRefused) {
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  ASSERT_TRUE(open_ok(path));
  raw_exec(path, "UPDATE meta SET schema_version = 'one' WHERE component = 'evaluations'");
  std::string error;
  EXPECT_FALSE(evaluation_store::open(path, error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("schema version"), std::string::npos) << error;
}

TEST(EvaluationStore, GarbageFileIsAClearError) {
  temp_dir dir;
  std::string garbage;
  for (int i = 0; i < 8192; ++i)
    garbage += static_cast<char>((i * 7919 + 13) % 251);
  std::string path = dir.write("evaluations.sqlite", garbage);
  std::string error;
  auto store = evaluation_store::open(path, error);
  EXPECT_FALSE(store);
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("not a database"), std::string::npos) << error;
  // Nothing was written over it.
  std::ifstream in(path, std::ios::binary);
  std::string after((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(after, garbage);
}

TEST(EvaluationStore, CorruptHeaderIsAClearError) {
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  {
    auto store = open_ok(path);
    ASSERT_TRUE(store);
    std::string error;
    ASSERT_TRUE(store->record(make_record("k", "v"), error)) << error;
  }
  {
    // Keep the magic string, break the page size and the rest of the header.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);
    std::string junk(84, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  std::string error;
  auto store = evaluation_store::open(path, error);
  EXPECT_FALSE(store);
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("cannot open the evaluation store"), std::string::npos) << error;
}

TEST(EvaluationStore, DirectoryPathIsAnError) {
  temp_dir dir;
  std::filesystem::create_directories(dir.path() / "store");
  std::string path = dir.file("store");
  std::string error;
  EXPECT_FALSE(evaluation_store::open(path, error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("directory"), std::string::npos) << error;
}

TEST(EvaluationStore, PathBelowARegularFileIsAnError) {
  temp_dir dir;
  dir.write("plain", "not a directory");
  std::string path = dir.file("plain/evaluations.sqlite");
  std::string error;
  EXPECT_FALSE(evaluation_store::open(path, error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("cannot create the directory"), std::string::npos) << error;
}

TEST(EvaluationStore, ReadOnlyFileIsAnError) {
  if (geteuid() == 0)
    GTEST_SKIP() << "root writes to read-only files";
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  ASSERT_TRUE(open_ok(path));
  std::filesystem::permissions(path, std::filesystem::perms::owner_read);
  std::string error;
  EXPECT_FALSE(evaluation_store::open(path, error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("not writable"), std::string::npos) << error;
}

TEST(EvaluationStore, EmptyPathIsAnError) {
  std::string error;
  EXPECT_FALSE(evaluation_store::open("", error));
  EXPECT_NE(error.find("empty"), std::string::npos) << error;
}

TEST(EvaluationStore, AnotherApplicationsDatabaseIsRefused) {
  temp_dir dir;
  std::string path = dir.file("other.sqlite");
  raw_exec(path, "CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT)");
  std::string error;
  EXPECT_FALSE(evaluation_store::open(path, error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("not a maxkernel evaluation store"), std::string::npos) << error;
  EXPECT_EQ(raw_text(path, "SELECT count(*) FROM sqlite_master WHERE name = 'evaluations'"), "0");

  std::string tagged = dir.file("tagged.sqlite");
  raw_exec(tagged, "PRAGMA application_id = 42");
  error.clear();
  EXPECT_FALSE(evaluation_store::open(tagged, error));
  EXPECT_NE(error.find("application_id 42"), std::string::npos) << error;
}

TEST(EvaluationStore, SharesADatabaseWithAnotherMaxkernelComponent) {
  // A search-graph store may have created the file, with its own meta row and tables.
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  raw_exec(path, "PRAGMA application_id = 1297632078;"  // 0x4d584b4e, "MXKN"
                 "CREATE TABLE meta(component TEXT PRIMARY KEY NOT NULL, "
                 "schema_version INTEGER NOT NULL);"
                 "INSERT INTO meta VALUES ('graph', 3);"
                 "CREATE TABLE vertices(id INTEGER PRIMARY KEY)");
  auto store = open_ok(path);
  ASSERT_TRUE(store);
  std::string error;
  EXPECT_TRUE(store->record(make_record("k", "v"), error)) << error;
  EXPECT_EQ(raw_text(path, "SELECT group_concat(component || '=' || schema_version) FROM "
                           "(SELECT * FROM meta ORDER BY component)"),
            "evaluations=" + std::to_string(evaluation_store::schema_version) + ",graph=3");
}

}  // namespace
}  // namespace maxkernel::search
