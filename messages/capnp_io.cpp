#include "messages/capnp_io.hpp"

#include <capnp/any.h>
#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include "maxkernel/schema/common.capnp.h"
#include <kj/exception.h>

#include <cstring>
#include <algorithm>
#include <limits>
#include <memory>
#include <unordered_map>
#include <vector>

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

// The reference check: reads every field of a dynamic struct so that bad pointers throw now.
// The planned walk below does the same reads without the dynamic API's per-field schema
// lookups, and hands deep messages over to this one (where the depth limit is checked).
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

// The planned walk. Per struct schema, once: the fields whose reads can fail (pointers: text,
// data, struct, list) and the groups, in the order the dynamic walk visits them, with the
// union member each belongs to. Each is then read through the same capnp reader calls the
// dynamic API makes (getStruct, getList with the element size of its type, getBlob), so the
// same input fails with the same exception and counts the same words against the traversal
// limit; fields of primitive type cannot fail and are skipped. Until the depth gets near
// the nesting limit, where the dynamic walk takes over.
constexpr int planned_depth = nesting_limit / 2;
constexpr uint16_t no_discriminant = 0xffff;

struct struct_plan;
struct list_plan;

enum class read_kind : uint8_t { none, text, data, structure, list, group, any };

struct list_plan {
  capnp::ListSchema schema;
  read_kind element = read_kind::none;   // none: primitives and enums
  const struct_plan* structure = nullptr;
  std::unique_ptr<list_plan> inner;      // a list of lists
};

struct field_plan {
  read_kind kind = read_kind::none;
  uint16_t discriminant = no_discriminant;  // the union member's value, if it is one
  uint32_t pointer = 0;
  const struct_plan* structure = nullptr;  // structure and group
  std::unique_ptr<list_plan> list;
  capnp::StructSchema::Field field;        // any: asked of the dynamic API
};

struct struct_plan {
  capnp::StructSchema schema;
  uint32_t discriminant_offset = 0;  // in 16-bit units of the data section
  bool dynamic = false;              // holds a capability: walked the dynamic way
  std::vector<field_plan> fields;
};

struct schema_hash {
  size_t operator()(const capnp::Schema& s) const { return s.hashCode(); }
};

// One cache per thread: decode runs on every scheduler thread.
struct plan_cache {
  std::unordered_map<capnp::Schema, std::unique_ptr<struct_plan>, schema_hash> plans;

  const struct_plan* of(capnp::StructSchema schema) {
    auto it = plans.find(schema);
    if (it != plans.end())
      return it->second.get();
    auto plan = std::make_unique<struct_plan>();
    auto* p = plan.get();
    plans.emplace(schema, std::move(plan));  // before the fields: a type may hold itself
    p->schema = schema;
    p->discriminant_offset = schema.getProto().getStruct().getDiscriminantOffset();
    for (auto field : schema.getFields()) {
      auto proto = field.getProto();
      field_plan f;
      f.discriminant = proto.getDiscriminantValue();
      if (proto.isGroup()) {
        f.kind = read_kind::group;
        f.structure = of(field.getType().asStruct());
        p->dynamic = p->dynamic || f.structure->dynamic;
        p->fields.push_back(std::move(f));
        continue;
      }
      auto type = field.getType();
      f.pointer = proto.getSlot().getOffset();
      switch (type.which()) {
        case capnp::schema::Type::TEXT: f.kind = read_kind::text; break;
        case capnp::schema::Type::DATA: f.kind = read_kind::data; break;
        case capnp::schema::Type::STRUCT:
          f.kind = read_kind::structure;
          f.structure = of(type.asStruct());
          break;
        case capnp::schema::Type::LIST:
          f.kind = read_kind::list;
          f.list = list_of(type.asList(), p->dynamic);
          break;
        case capnp::schema::Type::INTERFACE: p->dynamic = true; break;
        case capnp::schema::Type::ANY_POINTER:
          // The dynamic has() reads an AnyPointer's pointer type (far pointers followed).
          f.kind = read_kind::any;
          f.field = field;
          break;
        default: break;  // primitives and enums: nothing to read
      }
      if (f.kind != read_kind::none)
        p->fields.push_back(std::move(f));
    }
    return p;
  }

  std::unique_ptr<list_plan> list_of(capnp::ListSchema schema, bool& dynamic) {
    auto l = std::make_unique<list_plan>();
    l->schema = schema;
    switch (schema.whichElementType()) {
      case capnp::schema::Type::TEXT: l->element = read_kind::text; break;
      case capnp::schema::Type::DATA: l->element = read_kind::data; break;
      case capnp::schema::Type::STRUCT:
        l->element = read_kind::structure;
        l->structure = of(schema.getStructElementType());
        break;
      case capnp::schema::Type::LIST:
        l->element = read_kind::list;
        l->inner = list_of(schema.getListElementType(), dynamic);
        break;
      case capnp::schema::Type::INTERFACE:
      case capnp::schema::Type::ANY_POINTER: dynamic = true; break;
      default: break;
    }
    return l;
  }
};

plan_cache& plans() {
  thread_local plan_cache cache;
  return cache;
}

void walk_planned(capnp::AnyStruct::Reader s, const struct_plan& plan, int depth);

void walk_pointer(capnp::AnyPointer::Reader p, read_kind kind, const struct_plan* structure,
                  const list_plan* list, int depth);

void walk_list(capnp::AnyPointer::Reader p, const list_plan& plan, int depth) {
  auto dynamic = p.getAs<capnp::DynamicList>(plan.schema);  // getList(element size of the type)
  if (depth >= planned_depth)
    return walk(dynamic, depth);
  if (dynamic.size() == 0 || plan.element == read_kind::none)
    return;
  auto any = dynamic.as<capnp::AnyList>();
  if (plan.element == read_kind::structure) {
    for (auto item : any.as<capnp::List<capnp::AnyStruct>>())
      walk_planned(item, *plan.structure, depth + 1);
    return;
  }
  for (auto item : any.as<capnp::List<capnp::AnyPointer>>())
    walk_pointer(item, plan.element, plan.structure, plan.inner.get(), depth + 1);
}

void walk_pointer(capnp::AnyPointer::Reader p, read_kind kind, const struct_plan* structure,
                  const list_plan* list, int depth) {
  switch (kind) {
    case read_kind::text: (void)p.getAs<capnp::Text>(); break;
    case read_kind::data: (void)p.getAs<capnp::Data>(); break;
    case read_kind::structure: walk_planned(p.getAs<capnp::AnyStruct>(), *structure, depth); break;
    case read_kind::list: walk_list(p, *list, depth); break;
    default: break;
  }
}

uint16_t discriminant_of(capnp::AnyStruct::Reader s, uint32_t offset) {
  // As StructReader::getDataField: 0 beyond the data section.
  auto data = s.getDataSection();
  if ((size_t{offset} + 1) * 2 > data.size())
    return 0;
  uint16_t v;
  std::memcpy(&v, data.begin() + size_t{offset} * 2, 2);
  return v;  // little-endian on every machine this builds for
}

void walk_planned(capnp::AnyStruct::Reader s, const struct_plan& plan, int depth) {
  if (plan.dynamic || depth >= planned_depth)
    return walk_struct(s.as<capnp::DynamicStruct>(plan.schema), depth);
  auto pointers = s.getPointerSection();
  bool has_union = false;
  uint16_t active = 0;
  for (const auto& f : plan.fields) {
    if (f.discriminant != no_discriminant) {
      if (!has_union) {
        active = discriminant_of(s, plan.discriminant_offset);
        has_union = true;
      }
      if (active != f.discriminant)
        continue;
    }
    if (f.kind == read_kind::group) {
      walk_planned(s, *f.structure, depth + 1);
      continue;
    }
    if (f.kind == read_kind::any) {
      (void)s.as<capnp::DynamicStruct>(plan.schema).has(f.field);
      continue;
    }
    if (f.pointer >= pointers.size() || pointers[f.pointer].isNull())
      continue;
    walk_pointer(pointers[f.pointer], f.kind, f.structure, f.list.get(), depth + 1);
  }
}
}  // namespace

namespace {
// Every pointer of the message, whether the schema knows it or not (a copy of a part of the
// message, encode_root, follows them all): through capnp's checked readers, so each resolves
// inside the message within the traversal and nesting limits; no capability pointer, which
// no message of this protocol holds and a copy refuses.
void check_pointers(capnp::AnyPointer::Reader p) {
  switch (p.getPointerType()) {
    case capnp::PointerType::NULL_: return;
    case capnp::PointerType::CAPABILITY:
      KJ_FAIL_REQUIRE("a capability pointer; no message of this protocol holds one");
    case capnp::PointerType::STRUCT:
      for (auto q : p.getAs<capnp::AnyStruct>().getPointerSection())
        check_pointers(q);
      return;
    case capnp::PointerType::LIST: {
      auto list = p.getAs<capnp::AnyList>();
      switch (list.getElementSize()) {
        case capnp::ElementSize::POINTER:
          for (auto q : list.as<capnp::List<capnp::AnyPointer>>())
            check_pointers(q);
          return;
        case capnp::ElementSize::INLINE_COMPOSITE:
          for (auto item : list.as<capnp::List<capnp::AnyStruct>>())
            for (auto q : item.getPointerSection())
              check_pointers(q);
          return;
        default: return;  // data only
      }
    }
  }
}
}  // namespace

std::string encode(capnp::MessageBuilder& message) {
  // The flat form messageToFlatArray makes (segment count - 1, each segment's size in words,
  // padded to a word, then the segments), appended straight into the string: not into a word
  // array that is then copied, nor into a string zeroed first. Every message an actor sends
  // goes through here.
  auto segments = message.getSegmentsForOutput();
  size_t table_words = segments.size() / 2 + 1;
  std::string out;
  out.reserve(capnp::computeSerializedSizeInWords(segments) * sizeof(capnp::word));
  uint32_t small[16] = {};  // up to 15 segments without an allocation
  std::vector<uint32_t> large;
  uint32_t* table = small;
  if (table_words * 2 > std::size(small)) {
    large.assign(table_words * 2, 0);
    table = large.data();
  }
  table[0] = static_cast<uint32_t>(segments.size() - 1);
  for (size_t k = 0; k < segments.size(); ++k)
    table[k + 1] = static_cast<uint32_t>(segments[k].size());
  // capnp's table is little-endian, as is every machine this builds for.
  out.append(reinterpret_cast<const char*>(table), table_words * sizeof(capnp::word));
  for (auto segment : segments)
    out.append(reinterpret_cast<const char*>(segment.begin()),
               segment.size() * sizeof(capnp::word));
  return out;
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
    // On its own reader, so that the consumers' reads get the whole traversal limit. That
    // reader's limit is scaled to the message: a message a builder made points at each object
    // once, so the walk reads each word at most once; one whose pointers share an object (a
    // thousand list entries at one blob: CPU amplification) is refused here, before the planned
    // walk and the consumers read it again.
    auto check_options = reader_options();
    check_options.traversalLimitInWords =
      std::min<uint64_t>(traversal_limit_words, 2 * msg.words_.size() + 64);
    check_pointers(capnp::FlatArrayMessageReader(msg.words_.asPtr(), check_options)
                     .getRoot<capnp::AnyPointer>());
    msg.reader_ = std::make_unique<capnp::FlatArrayMessageReader>(msg.words_.asPtr(),
                                                                  reader_options());
  } catch (const kj::Exception& e) {
    error = std::string("malformed message: ") + e.getDescription().cStr();
    return std::nullopt;
  }
  return msg;
}

decoded_message decoded_message::from_own(std::string_view bytes) {
  KJ_REQUIRE(bytes.size() % sizeof(capnp::word) == 0, "not bytes of messages::encode");
  decoded_message msg;
  msg.words_ = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(msg.words_.begin(), bytes.data(), bytes.size());
  msg.allow_rereading();
  return msg;
}

void decoded_message::allow_rereading() {
  auto opts = reader_options();
  opts.traversalLimitInWords = std::numeric_limits<uint64_t>::max();
  reader_ = std::make_unique<capnp::FlatArrayMessageReader>(words_.asPtr(), opts);
}

bool schema_version_ok(uint32_t version, std::string& error) {
  if (version == maxkernel::schema::SCHEMA_VERSION)
    return true;
  error = "message has schema version " + std::to_string(version) + ", this build reads " +
          std::to_string(maxkernel::schema::SCHEMA_VERSION);
  return false;
}

namespace {
template <class Walk>
bool check_with(decoded_message& msg, capnp::StructSchema type, std::string& error, Walk walk) {
  try {
    auto root = msg.root(type);
    walk(root);
    KJ_IF_MAYBE (field, type.findFieldByName("schemaVersion")) {
      if (!schema_version_ok(root.get(*field).as<uint32_t>(), error))
        return false;
    }
  } catch (const kj::Exception& e) {
    error = std::string("malformed message: ") + e.getDescription().cStr();
    return false;
  }
  return true;
}
}  // namespace

bool check_traversal(decoded_message& msg, capnp::StructSchema type, std::string& error) {
  return check_with(msg, type, error, [&](capnp::DynamicStruct::Reader root) {
    walk_planned(root.as<capnp::AnyStruct>(), *plans().of(type), 0);
  });
}

bool check_traversal_dynamic(decoded_message& msg, capnp::StructSchema type,
                             std::string& error) {
  return check_with(msg, type, error,
                    [](capnp::DynamicStruct::Reader root) { walk_struct(root, 0); });
}

}  // namespace maxkernel::messages
