// Several connections on one store file at once: threads of one process sharing a store,
// two store objects, and two processes (node processes of one machine share the file).
#include "search/evaluation_store.hpp"

#include "temp_dir.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <latch>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace maxkernel::search {
namespace {

using test::temp_dir;

constexpr int per_writer = 250;
constexpr int shared_keys = 50;

evaluation_record make_record(const std::string& key, const std::string& result) {
  evaluation_record r;
  r.key = key;
  r.result = result;
  r.spec_name = "matmul";
  r.chip = "v5e";
  r.backend = "model";
  r.time_us = 1;
  return r;
}

// Writes per_writer keys of its own and every shared key, looking each up first as the node
// does. Returns the errors it met.
std::vector<std::string> write_all(evaluation_store& store, int writer) {
  std::vector<std::string> errors;
  std::string error;
  std::string tag = "w" + std::to_string(writer);
  for (int i = 0; i < per_writer; ++i) {
    std::string key = tag + "-" + std::to_string(i);
    store.find(key);
    if (!store.record(make_record(key, tag + ":" + std::to_string(i)), error))
      errors.push_back(error);
    if (i < shared_keys) {
      std::string shared = "shared-" + std::to_string(i);
      if (!store.find(shared) && !store.record(make_record(shared, tag), error))
        errors.push_back(error);
    }
  }
  return errors;
}

// Every writer's own records are there, and each shared key has exactly one winner that all
// stores agree on.
void expect_complete(const std::vector<evaluation_store*>& stores, int writers) {
  for (auto* store : stores) {
    EXPECT_EQ(store->size(), static_cast<uint64_t>(writers * per_writer + shared_keys));
    EXPECT_EQ(store->last_error(), "");
  }
  for (int w = 0; w < writers; ++w)
    for (int i = 0; i < per_writer; ++i) {
      std::string tag = "w" + std::to_string(w);
      auto found = stores.front()->find(tag + "-" + std::to_string(i));
      ASSERT_TRUE(found) << tag << "-" << i;
      EXPECT_EQ(*found, tag + ":" + std::to_string(i));
    }
  for (int i = 0; i < shared_keys; ++i) {
    std::set<std::string> seen;
    for (auto* store : stores) {
      auto found = store->find("shared-" + std::to_string(i));
      ASSERT_TRUE(found) << "shared-" << i;
      seen.insert(*found);
    }
    ASSERT_EQ(seen.size(), 1u) << "shared-" << i;
    EXPECT_EQ(seen.begin()->substr(0, 1), "w");
  }
}

TEST(StoreConcurrency, TwoStoresOnOneFileWrittenFromThreads) {
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  std::string error;
  auto a = evaluation_store::open(path, error);
  ASSERT_TRUE(a) << error;
  auto b = evaluation_store::open(path, error);
  ASSERT_TRUE(b) << error;
  constexpr int writers = 4;  // two threads per store object, as node actors share one
  std::vector<std::vector<std::string>> errors(writers);
  std::latch start(writers);
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w)
    threads.emplace_back([&, w] {
      start.arrive_and_wait();
      errors[w] = write_all(w % 2 ? *b : *a, w);
    });
  for (auto& t : threads)
    t.join();
  for (int w = 0; w < writers; ++w)
    EXPECT_TRUE(errors[w].empty()) << "writer " << w << ": " << errors[w].front();
  expect_complete({a.get(), b.get()}, writers);
  // Every find was counted once, on the store that made it.
  EXPECT_EQ(a->hits() + a->misses() + b->hits() + b->misses(),
            static_cast<uint64_t>(writers * (per_writer + shared_keys) +
                                  writers * per_writer + 2 * shared_keys));
}

TEST(StoreConcurrency, ConcurrentOpensOfANewFile) {
  // Node processes starting together both find no database and create it.
  temp_dir dir;
  std::string path = dir.file("new/evaluations.sqlite");
  constexpr int writers = 4;
  std::vector<std::unique_ptr<evaluation_store>> stores(writers);
  std::vector<std::string> open_errors(writers);
  std::latch start(writers);
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w)
    threads.emplace_back([&, w] {
      start.arrive_and_wait();
      stores[w] = evaluation_store::open(path, open_errors[w]);
    });
  for (auto& t : threads)
    t.join();
  std::vector<evaluation_store*> all;
  for (int w = 0; w < writers; ++w) {
    ASSERT_TRUE(stores[w]) << open_errors[w];
    all.push_back(stores[w].get());
  }
  std::vector<std::vector<std::string>> errors(writers);
  threads.clear();
  for (int w = 0; w < writers; ++w)
    threads.emplace_back([&, w] { errors[w] = write_all(*stores[w], w); });
  for (auto& t : threads)
    t.join();
  for (int w = 0; w < writers; ++w)
    EXPECT_TRUE(errors[w].empty()) << "writer " << w << ": " << errors[w].front();
  expect_complete(all, writers);
}

TEST(StoreConcurrency, TwoProcessesOnOneFile) {
  temp_dir dir;
  std::string path = dir.file("evaluations.sqlite");
  constexpr int writers = 2;
  int gate[2];
  ASSERT_EQ(pipe(gate), 0);
  std::vector<pid_t> children;
  for (int w = 0; w < writers; ++w) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: wait for the gate to open so both start together; report by exit code.
      close(gate[1]);
      char c;
      while (read(gate[0], &c, 1) > 0) {
      }
      std::string error;
      auto store = evaluation_store::open(path, error);
      if (!store)
        _exit(10);
      _exit(write_all(*store, w).empty() ? 0 : 11);
    }
    children.push_back(pid);
  }
  close(gate[0]);
  close(gate[1]);  // opens the gate: the children's reads return 0
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "10: open failed, 11: a record failed";
  }
  std::string error;
  auto store = evaluation_store::open(path, error);
  ASSERT_TRUE(store) << error;
  expect_complete({store.get()}, writers);
}

}  // namespace
}  // namespace maxkernel::search
