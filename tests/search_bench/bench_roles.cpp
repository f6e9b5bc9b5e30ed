#include "tests/search_bench/bench_roles.hpp"

#include "maxkernel/schema/agent.capnp.h"
#include "messages/content_hash.hpp"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <caf/actor_system.hpp>
#include <caf/result.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include <cstring>
#include <optional>

namespace maxkernel::search_bench {

namespace {

using messages::payload;

// A reader over the payload's bytes without the copy and the full walk that
// messages::decode makes: a PlannerRequest carries the whole history (megabytes late in a
// search), of which the stand-in reads two fields. Heap strings are word-aligned; a copy is
// made only when they are not.
class unchecked_reader {
public:
  explicit unchecked_reader(const std::string& bytes) {
    kj::ArrayPtr<const capnp::word> words;
    if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(capnp::word) == 0) {
      words = kj::arrayPtr(reinterpret_cast<const capnp::word*>(bytes.data()),
                           bytes.size() / sizeof(capnp::word));
    } else {
      copy_ = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
      std::memcpy(copy_.begin(), bytes.data(), copy_.size() * sizeof(capnp::word));
      words = copy_.asPtr();
    }
    capnp::ReaderOptions options;
    options.traversalLimitInWords = UINT64_MAX;
    reader_.emplace(words, options);
  }
  template <class T>
  typename T::Reader root() {
    return reader_->getRoot<T>();
  }

private:
  kj::Array<capnp::word> copy_;
  std::optional<capnp::FlatArrayMessageReader> reader_;
};

struct planner_state {
  uint64_t next = 0;  // the next variant number
  uint64_t limit = 0;
  static inline const char* name = "bench_planner";
};

messages::planner_actor::behavior_type bench_planner(
  messages::planner_actor::stateful_pointer<planner_state> self, uint64_t limit) {
  self->state.limit = limit;
  return {
    [self](messages::plan_atom, const payload& request) -> caf::result<payload> {
      if (request.type_id != capnp::typeId<schema::PlannerRequest>())
        return messages::make_error(messages::error_code::malformed_message,
                                    "bench planner: not a PlannerRequest");
      auto& st = self->state;
      try {
        unchecked_reader in(request.bytes);
        auto req = in.root<schema::PlannerRequest>();
        std::string parent = req.getParentId().cStr();
        uint64_t want = std::max<uint32_t>(1, req.getMaxSteps());
        uint64_t n = std::min(want, st.limit - std::min(st.limit, st.next));
        capnp::MallocMessageBuilder msg;
        auto plan = msg.initRoot<schema::Plan>();
        plan.setSchemaVersion(schema::SCHEMA_VERSION);
        if (n == 0)
          plan.setMessage(fmt::format("bench planner: the {} variants are used up", st.limit));
        auto steps = plan.initSteps(static_cast<unsigned>(n));
        for (unsigned i = 0; i < n; ++i) {
          uint64_t v = st.next++;
          auto s = steps[i];
          s.setMove(parent.empty() ? "template" : "benchVariant");
          s.setTemplate("bench_variant");
          s.setParentId(parent);
          auto change = s.initChanges(1)[0];
          change.setName("variant");
          change.setValue(std::to_string(v));
          s.setRationale(fmt::format("bench_search: variant {}", v));
          s.setExpectedEffect("none (the same kernel)");
          s.setScore(static_cast<double>(n - i));
          s.setBrain("bench");
        }
        return messages::make_payload<schema::Plan>(msg);
      } catch (const kj::Exception& e) {
        return messages::make_error(messages::error_code::malformed_message,
                                    std::string("bench planner: ") + e.getDescription().cStr());
      }
    },
  };
}

messages::implementer_actor::behavior_type bench_implementer(std::string base) {
  return {
    [base](messages::implement_atom, const payload& request) -> caf::result<payload> {
      if (request.type_id != capnp::typeId<schema::ImplementRequest>())
        return messages::make_error(messages::error_code::malformed_message,
                                    "bench implementer: not an ImplementRequest");
      try {
        unchecked_reader in(request.bytes);
        auto step = in.root<schema::ImplementRequest>().getStep();
        if (step.getChanges().size() != 1 || step.getChanges()[0].getName() != "variant")
          return messages::make_error(messages::error_code::bad_input,
                                      "bench implementer: a step without its variant");
        uint64_t v = std::stoull(step.getChanges()[0].getValue().cStr());
        auto source = variant_source(base, v);
        capnp::MallocMessageBuilder msg;
        auto reply = msg.initRoot<schema::ImplementReply>();
        reply.setSchemaVersion(schema::SCHEMA_VERSION);
        auto c = reply.initCandidate();
        c.setSchemaVersion(schema::SCHEMA_VERSION);
        c.setId(messages::sha256_hex(source));
        c.setSource(source);
        c.setParams(step.getChanges());
        c.setParentId(step.getParentId());
        c.setStrategy(fmt::format("{} {}", step.getMove().cStr(), v));
        c.setOrigin("bench_search");
        c.setTemplate(step.getTemplate());
        reply.initUsage();
        return messages::make_payload<schema::ImplementReply>(msg);
      } catch (const std::exception& e) {
        return messages::make_error(messages::error_code::bad_input,
                                    std::string("bench implementer: ") + e.what());
      } catch (const kj::Exception& e) {
        return messages::make_error(messages::error_code::malformed_message,
                                    std::string("bench implementer: ") +
                                      e.getDescription().cStr());
      }
    },
  };
}

messages::progress_listener_actor::behavior_type progress_counter(
  std::shared_ptr<std::atomic<uint64_t>> count) {
  return {
    [count](messages::progress_atom, const payload&) { ++*count; },
  };
}

}  // namespace

std::string variant_source(const std::string& base, uint64_t n) {
  std::string out = base;
  if (!out.empty() && out.back() != '\n')
    out += '\n';
  out += fmt::format("\n_BENCH_VARIANT = {}  # bench_search: the same kernel, a new source\n", n);
  return out;
}

messages::planner_actor spawn_bench_planner(caf::actor_system& sys, uint64_t limit) {
  return sys.spawn(bench_planner, limit);
}

messages::implementer_actor spawn_bench_implementer(caf::actor_system& sys, std::string base) {
  return sys.spawn(bench_implementer, std::move(base));
}

messages::progress_listener_actor spawn_progress_counter(
  caf::actor_system& sys, std::shared_ptr<std::atomic<uint64_t>> count) {
  return sys.spawn(progress_counter, std::move(count));
}

}  // namespace maxkernel::search_bench
