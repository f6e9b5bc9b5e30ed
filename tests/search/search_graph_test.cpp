// The search graph on real SQLite files: vertices round trip, resume, several searches and
// connections on one file, a process killed mid-search, the --out copy, bad files.
#include "search/search_graph.hpp"

#include "messages/capnp_io.hpp"
#include "search/evaluation_store.hpp"
#include "temp_dir.hpp"

#include <maxkernel/schema/search.capnp.h>

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

namespace maxkernel::search {
namespace {

using test::temp_dir;

struct vertex_fields {
  uint32_t index = 0;
  int32_t parent = -1;
  std::string strategy = "template";
  uint32_t round = 0;
  schema::VertexState state = schema::VertexState::EVALUATED;
  bool correct = true;
  double time_us = 10;
  std::string template_name = "matmul";
  std::string failure_class;
};

std::string make_vertex(const vertex_fields& f) {
  capnp::MallocMessageBuilder message;
  auto v = message.initRoot<schema::Vertex>();
  v.setIndex(f.index);
  v.setParent(f.parent);
  v.setStrategy(f.strategy);
  v.setRound(f.round);
  v.setState(f.state);
  v.setCorrect(f.correct);
  v.setTimeUs(f.time_us);
  v.setFailureClass(f.failure_class);
  v.setVerdict(f.correct ? "passed 3 cases" : "lower failed");
  auto c = v.initCandidate();
  c.setId("cand-" + std::to_string(f.index));
  c.setTemplate(f.template_name);
  c.setSource("def workload(x):\n  return x\n");
  auto params = c.initParams(1);
  params[0].setName("bm");
  params[0].setValue(std::to_string(128 * (f.index + 1)));
  return messages::encode(message);
}

std::string make_vertex(uint32_t index, int32_t parent, double time_us = 10) {
  vertex_fields f;
  f.index = index;
  f.parent = parent;
  f.time_us = time_us;
  f.strategy = parent < 0 ? "template" : "growBlock {bm: " + std::to_string(index) + "}";
  return make_vertex(f);
}

search_header make_header(const std::string& key, const std::string& settings = "settings-1") {
  search_header h;
  h.key = key;
  h.task = "matmul";
  h.mode = "graph";
  h.chip = "v6e";
  h.spec_bytes = std::string("spec\0bytes", 10);
  h.settings_bytes = settings;
  return h;
}

std::unique_ptr<search_graph> open_ok(const std::string& path) {
  std::string error;
  auto g = search_graph::open(path, error);
  EXPECT_TRUE(g) << error;
  EXPECT_EQ(error, "");
  return g;
}

void begin_ok(search_graph& g, const search_header& h, bool resume, bool expect_resumed) {
  std::string error;
  bool resumed = !expect_resumed;
  ASSERT_TRUE(g.begin(h, resume, resumed, error)) << error;
  EXPECT_EQ(resumed, expect_resumed);
}

void put_ok(search_graph& g, const std::string& bytes) {
  std::string error;
  ASSERT_TRUE(g.put_vertex(bytes, error)) << error;
}

std::vector<std::string> vertices_ok(const search_graph& g) {
  std::string error;
  auto out = g.vertices(error);
  EXPECT_EQ(error, "");
  return out;
}

void raw_exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* msg = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg);
  EXPECT_EQ(rc, SQLITE_OK) << (msg ? msg : "");
  sqlite3_free(msg);
  sqlite3_close(db);
}

// The rows of a query, columns joined by '|', rows by ';'.
std::string raw_rows(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK)
    return "<open error>";
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
    out = std::string("<error ") + sqlite3_errmsg(db) + ">";
  } else {
    while (sqlite3_step(st) == SQLITE_ROW) {
      if (!out.empty())
        out += ";";
      for (int i = 0; i < sqlite3_column_count(st); ++i) {
        auto t = sqlite3_column_text(st, i);
        out += (i ? "|" : "") + std::string(t ? reinterpret_cast<const char*>(t) : "NULL");
      }
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

TEST(SearchGraph, PutThenGetRoundTrip) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k1"), false, false);
  EXPECT_EQ(g->current_key(), "k1");
  vertex_fields failed;
  failed.index = 2;
  failed.parent = 0;
  failed.strategy = "shrinkBlock {bn: 64}";
  failed.round = 1;
  failed.state = schema::VertexState::FAILED;
  failed.correct = false;
  failed.time_us = 0;
  failed.failure_class = "lower_error";
  std::vector<std::string> bytes = {make_vertex(0, -1, 20.5), make_vertex(1, 0, 12.25),
                                    make_vertex(failed)};
  // Out of order on purpose: vertices() gives index order.
  put_ok(*g, bytes[2]);
  put_ok(*g, bytes[0]);
  put_ok(*g, bytes[1]);
  EXPECT_EQ(vertices_ok(*g), bytes);

  EXPECT_EQ(raw_rows(path, "SELECT idx, parent, strategy, round, state, correct, time_us, "
                           "candidate_id, template, failure_class FROM vertices ORDER BY idx"),
            "0|-1|template|0|evaluated|1|20.5|cand-0|matmul|;"
            "1|0|growBlock {bm: 1}|0|evaluated|1|12.25|cand-1|matmul|;"
            "2|0|shrinkBlock {bn: 64}|1|failed|0|NULL|cand-2|matmul|lower_error");
  EXPECT_EQ(raw_rows(path, "SELECT parent, child, strategy FROM edges ORDER BY child"),
            "0|1|growBlock {bm: 1};0|2|shrinkBlock {bn: 64}");
  EXPECT_EQ(raw_rows(path, "SELECT key, task, mode, chip, length(spec), settings FROM searches"),
            "k1|matmul|graph|v6e|10|settings-1");
}

TEST(SearchGraph, ReplacingAVertexReplacesItsRowAndEdge) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k1"), false, false);
  put_ok(*g, make_vertex(0, -1));
  put_ok(*g, make_vertex(1, -1));
  vertex_fields pending;
  pending.index = 2;
  pending.parent = 0;
  pending.strategy = "growBlock";
  pending.state = schema::VertexState::PENDING;
  pending.correct = false;
  pending.time_us = 0;
  put_ok(*g, make_vertex(pending));
  // Evaluated now, and (as a supervisor could rewrite it) derived from vertex 1.
  vertex_fields done = pending;
  done.parent = 1;
  done.strategy = "splitK";
  done.state = schema::VertexState::EVALUATED;
  done.correct = true;
  done.time_us = 7;
  put_ok(*g, make_vertex(done));
  auto vs = vertices_ok(*g);
  ASSERT_EQ(vs.size(), 3u);
  EXPECT_EQ(vs[2], make_vertex(done));
  EXPECT_EQ(raw_rows(path, "SELECT parent, child, strategy FROM edges"), "1|2|splitK");
  EXPECT_EQ(raw_rows(path, "SELECT state, time_us FROM vertices WHERE idx = 2"), "evaluated|7.0");
  // Back to a root: the edge goes.
  put_ok(*g, make_vertex(2, -1));
  EXPECT_EQ(raw_rows(path, "SELECT count(*) FROM edges"), "0");
}

TEST(SearchGraph, ResumeKeepsVerticesAndTakesTheNewSettings) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  std::vector<std::string> bytes = {make_vertex(0, -1), make_vertex(1, 0)};
  {
    auto g = open_ok(path);
    ASSERT_TRUE(g);
    begin_ok(*g, make_header("k1"), true, false);  // nothing to resume yet
    for (auto& b : bytes)
      put_ok(*g, b);
  }
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k1", "settings-2"), true, true);
  EXPECT_EQ(vertices_ok(*g), bytes);
  EXPECT_EQ(raw_rows(path, "SELECT settings FROM searches WHERE key = 'k1'"), "settings-2");
  put_ok(*g, make_vertex(2, 1));
  EXPECT_EQ(vertices_ok(*g).size(), 3u);
}

TEST(SearchGraph, WithoutResumeTheOldSearchIsDeleted) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k1"), false, false);
  put_ok(*g, make_vertex(0, -1));
  put_ok(*g, make_vertex(1, 0));
  begin_ok(*g, make_header("k1", "settings-2"), false, false);
  EXPECT_TRUE(vertices_ok(*g).empty());
  EXPECT_EQ(raw_rows(path, "SELECT count(*) FROM vertices"), "0");
  EXPECT_EQ(raw_rows(path, "SELECT count(*) FROM edges"), "0");
  EXPECT_EQ(raw_rows(path, "SELECT settings FROM searches"), "settings-2");
}

TEST(SearchGraph, ResumeRefusesAKeyOfAnotherTask) {
  temp_dir dir;
  auto g = open_ok(dir.file("graphs.sqlite"));
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k1"), false, false);
  put_ok(*g, make_vertex(0, -1));
  auto other = make_header("k1");
  other.chip = "v5e";
  std::string error;
  bool resumed = true;
  EXPECT_FALSE(g->begin(other, true, resumed, error));
  EXPECT_FALSE(resumed);
  EXPECT_NE(error.find("chip 'v6e'"), std::string::npos) << error;
  // The refused begin changed nothing.
  EXPECT_EQ(vertices_ok(*g).size(), 1u);
}

TEST(SearchGraph, TwoSearchesInOneFileStayApart) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  auto a = open_ok(path);
  auto b = open_ok(path);
  ASSERT_TRUE(a && b);
  begin_ok(*a, make_header("ka"), false, false);
  begin_ok(*b, make_header("kb"), false, false);
  std::vector<std::string> va = {make_vertex(0, -1, 5), make_vertex(1, 0, 4)};
  std::vector<std::string> vb = {make_vertex(0, -1, 50)};
  for (auto& v : va)
    put_ok(*a, v);
  for (auto& v : vb)
    put_ok(*b, v);
  EXPECT_EQ(vertices_ok(*a), va);
  EXPECT_EQ(vertices_ok(*b), vb);
  // Restarting one search leaves the other alone.
  begin_ok(*a, make_header("ka"), false, false);
  EXPECT_TRUE(vertices_ok(*a).empty());
  EXPECT_EQ(vertices_ok(*b), vb);
  EXPECT_EQ(raw_rows(path, "SELECT search_key, parent, child FROM edges"), "");
}

TEST(SearchGraph, ASecondConnectionSeesCommittedVertices) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  auto writer = open_ok(path);
  auto reader = open_ok(path);
  ASSERT_TRUE(writer && reader);
  begin_ok(*writer, make_header("k1"), false, false);
  put_ok(*writer, make_vertex(0, -1));
  begin_ok(*reader, make_header("k1"), true, true);
  EXPECT_EQ(vertices_ok(*reader).size(), 1u);
  // Later commits are seen too: the reader holds no stale snapshot.
  put_ok(*writer, make_vertex(1, 0));
  put_ok(*writer, make_vertex(2, 0));
  EXPECT_EQ(vertices_ok(*reader), vertices_ok(*writer));
  EXPECT_EQ(vertices_ok(*reader).size(), 3u);
}

TEST(SearchGraph, TwoProcessesWriteTwoSearchesInOneFile) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  constexpr int count = 60;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string error;
    auto g = search_graph::open(path, error);
    if (!g)
      _exit(10);
    bool resumed = false;
    if (!g->begin(make_header("child"), false, resumed, error))
      _exit(11);
    for (int i = 0; i < count; ++i)
      if (!g->put_vertex(make_vertex(i, i - 1, 100 + i), error))
        _exit(12);
    _exit(0);
  }
  std::string error;
  auto g = search_graph::open(path, error);
  ASSERT_TRUE(g) << error;
  begin_ok(*g, make_header("parent"), false, false);
  for (int i = 0; i < count; ++i)
    put_ok(*g, make_vertex(i, i / 2 - 1, 1 + i));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: open, 11: begin, 12: put_vertex failed";
  EXPECT_EQ(vertices_ok(*g).size(), static_cast<size_t>(count));
  auto child = open_ok(path);
  ASSERT_TRUE(child);
  begin_ok(*child, make_header("child"), true, true);
  auto vs = vertices_ok(*child);
  ASSERT_EQ(vs.size(), static_cast<size_t>(count));
  EXPECT_EQ(vs[7], make_vertex(7, 6, 107));
}

TEST(SearchGraph, AKilledSearchResumesWithEveryStoredVertex) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string error;
    auto g = search_graph::open(path, error);
    bool resumed = false;
    if (!g || !g->begin(make_header("k1"), false, resumed, error))
      _exit(10);
    for (int i = 0; i < 5; ++i)
      if (!g->put_vertex(make_vertex(i, i - 1), error))
        _exit(11);
    raise(SIGKILL);  // no destructor, no close: as a killed search
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit " << WEXITSTATUS(status);
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k1"), true, true);
  auto vs = vertices_ok(*g);
  ASSERT_EQ(vs.size(), 5u);
  EXPECT_EQ(vs[4], make_vertex(4, 3));
}

TEST(SearchGraph, CopyHoldsOnlyTheCurrentSearch) {
  temp_dir dir;
  std::string path = dir.file("state.sqlite");
  // The state directory's database also holds evaluations: the copy does not.
  {
    std::string error;
    auto store = evaluation_store::open(path, error);
    ASSERT_TRUE(store) << error;
    evaluation_record r;
    r.key = "e1";
    r.result = "bytes";
    ASSERT_TRUE(store->record(r, error)) << error;
  }
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("other"), false, false);
  put_ok(*g, make_vertex(0, -1, 99));
  put_ok(*g, make_vertex(1, 0, 98));
  begin_ok(*g, make_header("mine"), false, false);
  std::vector<std::string> mine = {make_vertex(0, -1), make_vertex(1, 0), make_vertex(2, 1)};
  for (auto& v : mine)
    put_ok(*g, v);

  // An existing file (and a stale WAL beside it) is replaced.
  std::string out = dir.write("out/search.sqlite", "old contents");
  dir.write("out/search.sqlite-wal", "stale");
  std::string error;
  ASSERT_TRUE(g->copy_to(out, error)) << error;
  EXPECT_FALSE(std::filesystem::exists(out + "-wal"));
  EXPECT_EQ(raw_rows(out, "PRAGMA journal_mode"), "delete");
  EXPECT_EQ(raw_rows(out, "SELECT key FROM searches"), "mine");
  EXPECT_EQ(raw_rows(out, "SELECT DISTINCT search_key FROM vertices"), "mine");
  EXPECT_EQ(raw_rows(out, "SELECT search_key, parent, child FROM edges ORDER BY child"),
            "mine|0|1;mine|1|2");
  EXPECT_EQ(raw_rows(out, "SELECT count(*) FROM sqlite_master WHERE name = 'evaluations'"), "0");
  EXPECT_EQ(raw_rows(out, "SELECT length(spec), settings FROM searches"), "10|settings-1");

  auto copy = open_ok(out);
  ASSERT_TRUE(copy);
  begin_ok(*copy, make_header("mine"), true, true);
  EXPECT_EQ(vertices_ok(*copy), mine);
  // The source is untouched and still usable.
  EXPECT_EQ(vertices_ok(*g), mine);
  EXPECT_EQ(raw_rows(path, "SELECT count(*) FROM searches"), "2");
  put_ok(*g, make_vertex(3, 2));
}

// hitl's transcript: entries in order per search, kept on resume, dropped when the search is
// begun anew, in the --out copy, and added to a file written before the table existed.
TEST(SearchGraph, TranscriptEntriesStayWithTheirSearch) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  std::string error;
  {
    auto g = open_ok(path);
    ASSERT_TRUE(g);
    EXPECT_FALSE(g->append_transcript("early", error));
    EXPECT_NE(error.find("before a search is begun"), std::string::npos) << error;
    error.clear();
    begin_ok(*g, make_header("k1"), false, false);
    ASSERT_TRUE(g->append_transcript("proposal 1", error)) << error;
    ASSERT_TRUE(g->append_transcript(std::string("decision\0 1", 12), error)) << error;
    begin_ok(*g, make_header("k2"), false, false);
    ASSERT_TRUE(g->append_transcript("other search", error)) << error;
  }
  {
    auto g = open_ok(path);
    ASSERT_TRUE(g);
    begin_ok(*g, make_header("k1"), true, true);
    auto entries = g->transcript(error);
    EXPECT_EQ(error, "");
    EXPECT_EQ(entries, (std::vector<std::string>{"proposal 1", std::string("decision\0 1", 12)}));
    ASSERT_TRUE(g->append_transcript("proposal 2", error)) << error;
    EXPECT_EQ(g->transcript(error).size(), 3u);
    std::string out = dir.file("out/search.sqlite");
    ASSERT_TRUE(g->copy_to(out, error)) << error;
    EXPECT_EQ(raw_rows(out, "SELECT search_key, n FROM transcript ORDER BY n"),
              "k1|0;k1|1;k1|2");
    begin_ok(*g, make_header("k1"), false, false);
    EXPECT_TRUE(g->transcript(error).empty());
    EXPECT_EQ(raw_rows(path, "SELECT search_key FROM transcript"), "k2");
  }
  // A version 1 file from before the transcript: opening it adds the table.
  raw_exec(path, "DROP TABLE transcript");
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k2"), true, true);
  EXPECT_TRUE(g->transcript(error).empty());
  ASSERT_TRUE(g->append_transcript("after", error)) << error;
  EXPECT_EQ(g->transcript(error), std::vector<std::string>{"after"});
}

TEST(SearchGraph, CopyRefusesItsOwnFileAndNeedsASearch) {
  temp_dir dir;
  std::string path = dir.file("graphs.sqlite");
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  std::string error;
  EXPECT_FALSE(g->copy_to(dir.file("out.sqlite"), error));
  EXPECT_NE(error.find("before one is begun"), std::string::npos) << error;
  begin_ok(*g, make_header("k1"), false, false);
  put_ok(*g, make_vertex(0, -1));
  error.clear();
  EXPECT_FALSE(g->copy_to(path, error));
  EXPECT_NE(error.find("own file"), std::string::npos) << error;
  EXPECT_EQ(vertices_ok(*g).size(), 1u);
}

TEST(SearchGraph, SharesAFileWithTheEvaluationStore) {
  temp_dir dir;
  std::string path = dir.file("state.sqlite");
  auto g = open_ok(path);
  ASSERT_TRUE(g);
  std::string error;
  auto store = evaluation_store::open(path, error);
  ASSERT_TRUE(store) << error;
  begin_ok(*g, make_header("k1"), false, false);
  put_ok(*g, make_vertex(0, -1));
  evaluation_record r;
  r.key = "e1";
  r.result = "bytes";
  ASSERT_TRUE(store->record(r, error)) << error;
  EXPECT_EQ(raw_rows(path, "SELECT component, schema_version FROM meta ORDER BY component"),
            "evaluations|1;search_graph|1");
  EXPECT_TRUE(open_ok(path));
}

TEST(SearchGraph, BadFilesAreErrorsNamingTheFile) {
  temp_dir dir;
  std::string error;
  std::string text = dir.write("notes.sqlite", std::string(4096, 'x'));
  EXPECT_FALSE(search_graph::open(text, error));
  EXPECT_EQ(error.rfind(text + ": ", 0), 0u) << error;
  EXPECT_NE(error.find("not a database"), std::string::npos) << error;

  std::string newer = dir.file("newer.sqlite");
  ASSERT_TRUE(open_ok(newer));
  raw_exec(newer, "UPDATE meta SET schema_version = 99 WHERE component = 'search_graph'");
  error.clear();
  EXPECT_FALSE(search_graph::open(newer, error));
  EXPECT_NE(error.find("schema version 99"), std::string::npos) << error;
  EXPECT_EQ(error.rfind(newer + ": ", 0), 0u) << error;

  std::string garbled = dir.file("garbled.sqlite");
  ASSERT_TRUE(open_ok(garbled));
  raw_exec(garbled, "UPDATE meta SET schema_version = 'one' WHERE component = 'search_graph'");
  error.clear();
  EXPECT_FALSE(search_graph::open(garbled, error));
  EXPECT_NE(error.find("not a version number"), std::string::npos) << error;

  std::string foreign = dir.file("foreign.sqlite");
  raw_exec(foreign, "CREATE TABLE people(name TEXT)");
  error.clear();
  EXPECT_FALSE(search_graph::open(foreign, error));
  EXPECT_NE(error.find("tables of its own"), std::string::npos) << error;

  std::string other_app = dir.file("other_app.sqlite");
  raw_exec(other_app, "PRAGMA application_id = 42");
  error.clear();
  EXPECT_FALSE(search_graph::open(other_app, error));
  EXPECT_NE(error.find("another application"), std::string::npos) << error;

  error.clear();
  EXPECT_FALSE(search_graph::open(dir.path().string(), error));
  EXPECT_NE(error.find("is a directory"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(search_graph::open("", error));
  EXPECT_NE(error, "");
}

TEST(SearchGraph, BadVerticesAreRefused) {
  temp_dir dir;
  auto g = open_ok(dir.file("graphs.sqlite"));
  ASSERT_TRUE(g);
  std::string error;
  EXPECT_FALSE(g->put_vertex(make_vertex(0, -1), error));
  EXPECT_NE(error.find("before a search is begun"), std::string::npos) << error;
  EXPECT_TRUE(g->vertices(error).empty());
  begin_ok(*g, make_header("k1"), false, false);
  error.clear();
  EXPECT_FALSE(g->put_vertex("not a capnp message", error));
  EXPECT_NE(error.find("not a Vertex"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(g->put_vertex(make_vertex(3, 3), error));
  EXPECT_NE(error.find("parent 3"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(g->put_vertex(make_vertex(1, -2), error));
  EXPECT_NE(error.find("parent -2"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(g->put_vertex(make_vertex(1, 0, -1), error));
  EXPECT_NE(error.find("not a time"), std::string::npos) << error;
  EXPECT_TRUE(vertices_ok(*g).empty());
  std::string header_error;
  bool resumed = false;
  EXPECT_FALSE(g->begin(make_header(""), false, resumed, header_error));
  EXPECT_NE(header_error.find("without a key"), std::string::npos);
}

// Vertices the caller holds decoded (search_record's own encodings) are stored as the bytes
// are, with the same checks of parent and time, and not decoded again.
TEST(SearchGraph, DecodedVerticesAreStoredAsTheirBytes) {
  temp_dir dir;
  auto g = open_ok(dir.file("graphs.sqlite"));
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k1"), false, false);
  std::vector<std::string> bytes{make_vertex(0, -1, 12), make_vertex(1, 0, 9)};
  std::vector<messages::decoded_message> decoded;
  for (const auto& b : bytes)
    decoded.push_back(messages::decoded_message::from_own(b));
  std::string error;
  ASSERT_TRUE(g->put_decoded_vertices(bytes, decoded, error)) << error;
  EXPECT_EQ(vertices_ok(*g), bytes);

  std::vector<std::string> bad{make_vertex(2, 2)};
  std::vector<messages::decoded_message> bad_decoded;
  bad_decoded.push_back(messages::decoded_message::from_own(bad[0]));
  EXPECT_FALSE(g->put_decoded_vertices(bad, bad_decoded, error));
  EXPECT_NE(error.find("parent 2"), std::string::npos) << error;
  error.clear();
  std::vector<messages::decoded_message> none;
  EXPECT_FALSE(g->put_decoded_vertices(bytes, none, error));
  EXPECT_NE(error.find("0 decoded vertices for 2"), std::string::npos) << error;
  EXPECT_EQ(vertices_ok(*g), bytes);
}

// A batch stops at its first bad vertex, in order: a bad parent before bytes that do not
// decode is told as the parent.
TEST(SearchGraph, ABatchIsCheckedInOrder) {
  temp_dir dir;
  auto g = open_ok(dir.file("graphs.sqlite"));
  ASSERT_TRUE(g);
  begin_ok(*g, make_header("k1"), false, false);
  std::string error;
  EXPECT_FALSE(g->put_vertices({make_vertex(0, 0), "not a capnp message"}, error));
  EXPECT_NE(error.find("parent 0"), std::string::npos) << error;
  EXPECT_TRUE(vertices_ok(*g).empty());
}

}  // namespace
}  // namespace maxkernel::search
