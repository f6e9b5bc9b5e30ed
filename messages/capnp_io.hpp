// Encoding and decoding of Cap'n Proto messages to flat byte strings: the one form in which
// a message crosses an actor boundary, a ZeroMQ socket or goes to disk.
#pragma once

#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace maxkernel::messages {

// Serializes a whole message (segment table + segments) into a byte string.
std::string encode(capnp::MessageBuilder& message);

// Copies the root of `reader` into a fresh message and serializes it.
template <class Reader>
std::string encode_root(Reader reader) {
  capnp::MallocMessageBuilder message;
  message.setRoot(reader);
  return encode(message);
}

// Owns the aligned copy of the bytes and the reader over them. Bytes from a socket are
// not word-aligned and capnp 0.9 refuses unaligned data, so decoding always copies.
class decoded_message {
public:
  // Refuses input that is not a well-formed message (a segment table that does not fit, a
  // pointer out of bounds, too deep or too much to read); `error` says why.
  static std::optional<decoded_message> parse(std::string_view bytes, std::string& error);

  // Bytes this process encoded itself (messages::encode of a message it built) and that never
  // left it: copied to aligned words and read without decode's check, which would only walk
  // them again. Safe because a builder writes only well-formed messages (its setters and its
  // copies of readers read their sources through capnp's checked readers, and those sources
  // were decoded), and no struct of our schemas holds itself, so none nests deeper than the
  // nesting limit. Never for bytes from a socket, a file, a peer or another process: those
  // go through decode.
  static decoded_message from_own(std::string_view bytes);

  // The message's size in words (its segment table included).
  size_t words() const { return words_.size(); }

  template <class T>
  typename T::Reader root() {
    return reader_->getRoot<T>();
  }

  capnp::DynamicStruct::Reader root(capnp::StructSchema schema) {
    return reader_->getRoot<capnp::DynamicStruct>(schema);
  }

  // Lifts the traversal limit, for a message already checked that is then read many times
  // (the model prices one structure thousands of times in a fit or a benchmark; every read
  // counts against the limit that guards a peer's input).
  void allow_rereading();

private:
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

// A message's schemaVersion against this build's: false with the error every reader gives.
bool schema_version_ok(uint32_t version, std::string& error);

// Decodes and validates the root of a message: the reader is fully traversed once (so
// that a malformed pointer surfaces here, not deep inside a consumer) and the schema
// version is checked when the struct has one. Reads of the returned message cannot throw.
template <class T>
std::optional<decoded_message> decode(std::string_view bytes, std::string& error);

// Every pointer of the message read as its field's type says (a text's NUL, a list's element
// size, a struct where a struct is due, the union members that are set), each word counted
// against the traversal limit, and the depth bounded: the reads of capnp's dynamic API,
// planned once per schema.
bool check_traversal(decoded_message& msg, capnp::StructSchema type, std::string& error);
// The same check through the dynamic API field by field: the reference the tests hold the
// planned one to.
bool check_traversal_dynamic(decoded_message& msg, capnp::StructSchema type, std::string& error);

template <class T>
std::optional<decoded_message> decode(std::string_view bytes, std::string& error) {
  auto msg = decoded_message::parse(bytes, error);
  if (!msg)
    return std::nullopt;
  if (!check_traversal(*msg, capnp::Schema::from<T>(), error))
    return std::nullopt;
  // The check read every word once within the limit; the consumers' reads that follow would
  // otherwise count against what is left of it and could still throw (a list of many empty
  // structs counts one word per element: read twice, it passes the check and then fails).
  msg->allow_rereading();
  return msg;
}

}  // namespace maxkernel::messages
