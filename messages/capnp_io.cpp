#include "messages/capnp_io.hpp"

#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include "maxkernel/schema/common.capnp.h"
#include <kj/exception.h>

#include <cstring>
#include <limits>

namespace maxkernel::messages {

namespace {
// Bounds on what a peer may make us read: 64 MiB of words and 64 levels of nesting.
constexpr uint64_t traversal_limit_words = 8ull * 1024 * 1024;
constexpr int nesting_limit = 64;

capnp::ReaderOptions reader_options() {
  capnp::ReaderOptions opts;
  opts.traversalLimitInWords = traversal_limit_words;
  opts.nestingLimit = nesting_limit;
  return opts;
}

// Reads every field of a dynamic struct so that bad pointers throw now.
void walk(capnp::DynamicValue::Reader value, int depth);

void walk_struct(capnp::DynamicStruct::Reader s, int depth) {
  for (auto field : s.getSchema().getFields()) {
    if (!s.has(field))
      continue;
    walk(s.get(field), depth + 1);
  }
}

void walk(capnp::DynamicValue::Reader value, int depth) {
  if (depth > nesting_limit)
    KJ_FAIL_REQUIRE("message nests too deeply");
  switch (value.getType()) {
    case capnp::DynamicValue::STRUCT:
      walk_struct(value.as<capnp::DynamicStruct>(), depth);
      break;
    case capnp::DynamicValue::LIST:
      for (auto item : value.as<capnp::DynamicList>())
        walk(item, depth + 1);
      break;
    case capnp::DynamicValue::TEXT:
      (void) value.as<capnp::Text>();
      break;
    case capnp::DynamicValue::DATA:
      (void) value.as<capnp::Data>();
      break;
    default:
      break;
  }
}
}  // namespace

std::string encode(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

std::optional<decoded_message> decoded_message::parse(std::string_view bytes,
                                                      std::string& error) {
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) {
    error = "malformed message: " + std::to_string(bytes.size())
            + " bytes is not a whole number of 8-byte words";
    return std::nullopt;
  }
  decoded_message msg;
  msg.words_ = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(msg.words_.begin(), bytes.data(), bytes.size());
  try {
    msg.reader_ = std::make_unique<capnp::FlatArrayMessageReader>(msg.words_.asPtr(),
                                                                  reader_options());
  } catch (const kj::Exception& e) {
    error = std::string("malformed message: ") + e.getDescription().cStr();
    return std::nullopt;
  }
  return msg;
}

void decoded_message::allow_rereading() {
  auto opts = reader_options();
  opts.traversalLimitInWords = std::numeric_limits<uint64_t>::max();
  reader_ = std::make_unique<capnp::FlatArrayMessageReader>(words_.asPtr(), opts);
}

bool check_traversal(decoded_message& msg, capnp::StructSchema type, std::string& error) {
  try {
    auto root = msg.root(type);
    walk_struct(root, 0);
    KJ_IF_MAYBE (field, type.findFieldByName("schemaVersion")) {
      auto version = root.get(*field).as<uint32_t>();
      if (version != maxkernel::schema::SCHEMA_VERSION) {
        error = "message has schema version " + std::to_string(version) + ", this build reads "
                + std::to_string(maxkernel::schema::SCHEMA_VERSION);
        return false;
      }
    }
  } catch (const kj::Exception& e) {
    error = std::string("malformed message: ") + e.getDescription().cStr();
    return false;
  }
  return true;
}

}  // namespace maxkernel::messages
