// The evaluation store: every finished evaluation, recorded once under its content-addressed
// key (SQLite, WAL). The one cache of the system: repeats are answered from it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace maxkernel::search {

// What identifies an evaluation. Two requests with equal parts get the same result.
struct evaluation_key_parts {
  std::string_view source;         // kernel source (normalised before hashing); "" for a reference
  std::string_view spec_hash;      // content hash of the KernelSpec (canonical capnp bytes)
  std::string_view chip;
  std::string_view backend;        // model | jax-tpu
  std::string_view jax_version;
  std::string_view options;        // anything else that changes the result (seeds, full, ...)
  bool reference = false;          // the spec's reference rather than a candidate
};

// Line endings to \n, trailing whitespace of each line and trailing blank lines removed:
// edits that cannot change what Python runs.
std::string normalize_source(std::string_view source);
// Hex sha256 over the parts, each length-prefixed.
std::string evaluation_key(const evaluation_key_parts& parts);

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

  // The recorded EvalResult bytes of key, if any. Counts a hit or a miss.
  std::optional<std::string> find(const std::string& key);
  // Records once: a second record of the same key keeps the first. False on a database error.
  bool record(const evaluation_record& record, std::string& error);

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t size();
  const std::string& path() const { return path_; }

private:
  struct db;
  evaluation_store(std::unique_ptr<db> d, std::string path);
  std::unique_ptr<db> db_;
  std::string path_;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace maxkernel::search
