#include "search/graph_writer.hpp"

#include "messages/capnp_io.hpp"
#include "search/search_graph.hpp"

namespace maxkernel::search {

graph_writer::graph_writer(std::unique_ptr<search_graph> graph)
    : graph_(std::move(graph)), thread_([this] { run(); }) {}

graph_writer::~graph_writer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

bool graph_writer::put(std::vector<std::string> vertex_bytes,
                       std::vector<messages::decoded_message>& decoded, std::string& error) {
  if (!graph_->check_vertices(vertex_bytes, decoded, error))
    return false;
  {
    std::lock_guard lock(mu_);
    if (!failure_.empty()) {
      error = failure_;
      return false;
    }
    queue_.push_back(std::move(vertex_bytes));
  }
  wake_.notify_one();
  return true;
}

bool graph_writer::flush(std::string& error) {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [this] { return (queue_.empty() && !writing_) || !failure_.empty(); });
  if (!failure_.empty()) {
    error = failure_;
    return false;
  }
  return true;
}

size_t graph_writer::batches_written() const {
  std::lock_guard lock(mu_);
  return batches_;
}

size_t graph_writer::transactions() const {
  std::lock_guard lock(mu_);
  return transactions_;
}

void graph_writer::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty() || !failure_.empty()) {
      if (stopping_)
        return;
      queue_.clear();  // after a failure nothing more is written: the file stays a prefix
      idle_.notify_all();
      continue;
    }
    // Everything queued so far goes in one transaction: a writer that fell behind catches up
    // with one commit (one fsync) instead of one per batch.
    std::vector<std::string> all;
    size_t batches = queue_.size();
    for (auto& b : queue_)
      for (auto& v : b)
        all.push_back(std::move(v));
    queue_.clear();
    writing_ = true;
    lock.unlock();
    // The bytes passed put's checks as messages this process built: read without decode's
    // walk (decoded_message::from_own), as the record that gave them reads them, and stored
    // without checking them again.
    std::vector<messages::decoded_message> decoded;
    decoded.reserve(all.size());
    for (const auto& v : all)
      decoded.push_back(messages::decoded_message::from_own(v));
    std::string error;
    bool ok = graph_->store_vertices(all, decoded, error);
    lock.lock();
    writing_ = false;
    if (ok) {
      batches_ += batches;
      ++transactions_;
    } else if (failure_.empty()) {
      failure_ = std::move(error);
    }
    if (queue_.empty() || !failure_.empty())
      idle_.notify_all();
  }
}

}  // namespace maxkernel::search
