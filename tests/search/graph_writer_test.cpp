// The search graph written behind the search (search::graph_writer): batches land whole and
// in order, a killed process leaves a prefix of them, a failed write stops everything after
// it and is reported, refusals are immediate, and nothing queued is lost at the end.
#include "search/graph_writer.hpp"

#include "messages/capnp_io.hpp"
#include "search/search_graph.hpp"
#include "temp_dir.hpp"

#include <maxkernel/schema/search.capnp.h>

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

namespace maxkernel::search {
namespace {

using test::temp_dir;

std::string vertex(uint32_t index, int32_t parent, bool evaluated, double time_us = 0) {
  capnp::MallocMessageBuilder message;
  auto v = message.initRoot<schema::Vertex>();
  v.setIndex(index);
  v.setParent(parent);
  v.setStrategy(parent < 0 ? "template" : "growBlock");
  v.setState(evaluated ? schema::VertexState::EVALUATED : schema::VertexState::PENDING);
  v.setCorrect(evaluated);
  v.setTimeUs(time_us);
  auto c = v.initCandidate();
  c.setId("cand-" + std::to_string(index));
  c.setTemplate("matmul");
  c.setSource(std::string(4096, 'x'));  // the size of a real kernel's source, roughly
  return messages::encode(message);
}

// Batch i as a graph round writes it: vertex i fixed (pending), vertex i - 1's result in.
std::vector<std::string> batch(uint32_t i) {
  std::vector<std::string> b = {vertex(i, static_cast<int32_t>(i) - 1, false)};
  if (i > 0)
    b.push_back(vertex(i - 1, static_cast<int32_t>(i) - 2, true, 1000.0 - i));
  return b;
}

std::vector<messages::decoded_message> decoded(const std::vector<std::string>& b) {
  std::vector<messages::decoded_message> out;
  for (const auto& v : b)
    out.push_back(messages::decoded_message::from_own(v));
  return out;
}

bool put(graph_writer& w, std::vector<std::string> b, std::string& error) {
  auto d = decoded(b);
  return w.put(std::move(b), d, error);
}

search_header header() {
  search_header h;
  h.key = "k1";
  h.task = "matmul";
  h.mode = "graph";
  h.chip = "v6e";
  h.spec_bytes = "spec";
  h.settings_bytes = "settings";
  return h;
}

std::unique_ptr<search_graph> begun(const std::string& path, bool resume = false) {
  std::string error;
  auto g = search_graph::open(path, error);
  EXPECT_TRUE(g) << error;
  bool resumed = false;
  if (g)
    EXPECT_TRUE(g->begin(header(), resume, resumed, error)) << error;
  return g;
}

// (index, evaluated) of the stored vertices, read by a connection of its own.
std::vector<std::pair<uint32_t, bool>> stored(const std::string& path) {
  auto g = begun(path, true);
  std::string error;
  std::vector<std::pair<uint32_t, bool>> out;
  for (const auto& bytes : g->vertices(error)) {
    auto m = messages::decode<schema::Vertex>(bytes, error);
    EXPECT_TRUE(m) << error;
    auto v = m->root<schema::Vertex>();
    out.emplace_back(v.getIndex(), v.getState() == schema::VertexState::EVALUATED);
  }
  EXPECT_EQ(error, "");
  return out;
}

// What batches 0 .. n-1 leave: vertices 0 .. n-1, all but the last evaluated.
void expect_batches(const std::vector<std::pair<uint32_t, bool>>& got, uint32_t n) {
  ASSERT_EQ(got.size(), n);
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].first, i);
    EXPECT_EQ(got[i].second, i + 1 < n) << "vertex " << i << " of " << n;
  }
}

TEST(GraphWriter, WritesEveryBatchInOrderAndFlushMakesThemVisible) {
  temp_dir dir;
  auto path = dir.file("graphs.sqlite");
  graph_writer w(begun(path));
  std::string error;
  const uint32_t n = 300;
  for (uint32_t i = 0; i < n; ++i)
    ASSERT_TRUE(put(w, batch(i), error)) << error;
  ASSERT_TRUE(w.flush(error)) << error;
  expect_batches(stored(path), n);
  EXPECT_EQ(w.batches_written(), n);
  // Batches queued while a commit runs share the next one.
  EXPECT_LE(w.transactions(), n);
  EXPECT_GE(w.transactions(), 1u);
}

TEST(GraphWriter, WhatIsQueuedIsWrittenBeforeTheWriterGoes) {
  temp_dir dir;
  auto path = dir.file("graphs.sqlite");
  {
    graph_writer w(begun(path));
    std::string error;
    for (uint32_t i = 0; i < 50; ++i)
      ASSERT_TRUE(put(w, batch(i), error)) << error;
  }
  expect_batches(stored(path), 50);
}

TEST(GraphWriter, AVertexThatDoesNotFitIsRefusedAtOnceAndNothingOfItsBatchIsQueued) {
  temp_dir dir;
  auto path = dir.file("graphs.sqlite");
  graph_writer w(begun(path));
  std::string error;
  ASSERT_TRUE(put(w, batch(0), error)) << error;
  // Vertex 1 names parent 5, which does not precede it: the whole batch goes back.
  EXPECT_FALSE(put(w, {vertex(1, 5, false), vertex(0, -1, true, 10)}, error));
  EXPECT_NE(error.find("neither -1 nor an earlier vertex"), std::string::npos) << error;
  EXPECT_NE(error.find(path), std::string::npos) << error;
  // Bytes without their decoded messages are refused too (search_graph::check_vertices).
  std::vector<std::string> two = {vertex(1, 0, true, 10), vertex(2, 1, true, 10)};
  auto one = decoded({two[0]});
  EXPECT_FALSE(w.put(two, one, error));
  EXPECT_NE(error.find("1 decoded vertices for 2"), std::string::npos) << error;
  error.clear();
  ASSERT_TRUE(w.flush(error)) << error;  // a refusal is not a failed write
  expect_batches(stored(path), 1);
}

TEST(GraphWriter, AFailedWriteIsReportedAndNothingAfterItIsWritten) {
  temp_dir dir;
  auto path = dir.file("graphs.sqlite");
  graph_writer w(begun(path));
  std::string error;
  ASSERT_TRUE(put(w, batch(0), error)) << error;
  ASSERT_TRUE(put(w, batch(1), error)) << error;
  ASSERT_TRUE(w.flush(error)) << error;
  // Another connection makes every insert of vertex 2 fail, as a full disk would.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TRIGGER no_two BEFORE INSERT ON vertices WHEN NEW.idx = 2 "
                         "BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  // Batch 2 may be refused at put or at flush (when its commit fails is the thread's
  // business); either way the failure is the trigger's, and batch 3 is never written.
  bool second = put(w, batch(2), error) && put(w, batch(3), error) && w.flush(error);
  EXPECT_FALSE(second);
  EXPECT_NE(error.find("injected failure"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(put(w, batch(4), error));
  EXPECT_NE(error.find("injected failure"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(w.flush(error));
  expect_batches(stored(path), 2);
}

TEST(GraphWriter, AKilledProcessLeavesAPrefixOfTheBatches) {
  temp_dir dir;
  auto path = dir.file("graphs.sqlite");
  const uint32_t n = 400;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string error;
    auto g = search_graph::open(path, error);
    bool resumed = false;
    if (!g || !g->begin(header(), false, resumed, error))
      _exit(10);
    graph_writer w(std::move(g));
    for (uint32_t i = 0; i < n; ++i) {
      auto b = batch(i);
      auto d = decoded(b);
      if (!w.put(std::move(b), d, error))
        _exit(11);
    }
    raise(SIGKILL);  // no flush, no destructor: as a killed search
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit " << WEXITSTATUS(status);
  // However far the thread got, the file holds batches 0 .. m-1 for some m, each whole.
  auto got = stored(path);
  ASSERT_LE(got.size(), n);
  expect_batches(got, static_cast<uint32_t>(got.size()));
}

}  // namespace
}  // namespace maxkernel::search
