// A search graph written behind the search, from a thread of its own: put checks a batch of
// vertices and queues it; the thread commits the batches in the order given (several queued
// ones in one transaction when it falls behind). A supervisor so never waits on SQLite's
// commit and its fsync between rounds. The file always holds a prefix of the batches given,
// a state the search passed through, which a resume continues from (docs/search-graph.md,
// "Durability").
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace maxkernel::messages {
class decoded_message;
}

namespace maxkernel::search {

class search_graph;

class graph_writer {
public:
  // `graph` has a search begun (search_graph::begin).
  explicit graph_writer(std::unique_ptr<search_graph> graph);
  // Writes what is queued, then stops the thread.
  ~graph_writer();
  graph_writer(const graph_writer&) = delete;
  graph_writer& operator=(const graph_writer&) = delete;

  // Checks the vertices (`decoded[k]` is `vertex_bytes[k]`; the checks of
  // search_graph::put_vertices) and queues them as one batch, stored whole or not at all.
  // False with error when one does not fit, or when an earlier batch could not be written:
  // the first failure is kept and nothing is written after it.
  bool put(std::vector<std::string> vertex_bytes,
           std::vector<messages::decoded_message>& decoded, std::string& error);
  // Waits until every queued batch is committed; false with the first failure.
  bool flush(std::string& error);
  // The graph itself, for what is not written behind (the transcript): flush first.
  search_graph& graph() { return *graph_; }

  // Batches committed so far, and transactions used (fewer when batches were grouped).
  size_t batches_written() const;
  size_t transactions() const;

private:
  void run();

  std::unique_ptr<search_graph> graph_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<std::vector<std::string>> queue_;
  bool writing_ = false;
  bool stopping_ = false;
  std::string failure_;
  size_t batches_ = 0, transactions_ = 0;
  std::thread thread_;  // last: started when the rest is ready
};

}  // namespace maxkernel::search
