// The evaluation store: every finished evaluation, recorded once under its content-addressed
// key (SQLite, WAL). The one cache of the system: repeats are answered from it.
#pragma once

#include "search/evaluation_key.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace maxkernel::search {

// What is recorded next to the result, for queries of later issues (statistics, resume).
struct evaluation_record {
  std::string key;
  std::string result;              // encoded EvalResult
  std::string spec_name;
  std::string chip;
  std::string backend;
  bool correct = false;
  double time_us = 0;              // 0 when untimed
  std::string error_class;         // "" when every phase passed
};

class evaluation_store {
public:
  // Opens (creating if needed) the database at path; ":memory:" for a private one.
  static std::unique_ptr<evaluation_store> open(const std::string& path, std::string& error);
  ~evaluation_store();
  evaluation_store(const evaluation_store&) = delete;
  evaluation_store& operator=(const evaluation_store&) = delete;

  // The recorded EvalResult bytes of key, if any. Counts a hit or a miss; a database error
  // is a miss, its message kept in last_error().
  std::optional<std::string> find(const std::string& key);
  // Records once: a second record of the same key keeps the first. False on a database error.
  bool record(const evaluation_record& record, std::string& error);

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t size();
  const std::string& path() const { return path_; }
  // The message of the latest failed find() or size(); "" when none failed.
  std::string last_error() const;

  // The store's schema version: the `meta` row of an evaluation database and each record's.
  static constexpr int schema_version = 1;

private:
  struct db;
  evaluation_store(std::unique_ptr<db> d, std::string path);
  std::unique_ptr<db> db_;
  std::string path_;
  // Atomic: hits() and misses() are read without the store's lock.
  std::atomic<uint64_t> hits_ = 0;
  std::atomic<uint64_t> misses_ = 0;
};

}  // namespace maxkernel::search
