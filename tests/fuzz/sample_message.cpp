#include "sample_message.hpp"

#include "maxkernel/schema/common.capnp.h"
#include "messages/capnp_io.hpp"

#include <capnp/dynamic.h>
#include <capnp/message.h>

namespace maxkernel::fuzz {

namespace {

constexpr int max_depth = 4;

void fill(capnp::DynamicStruct::Builder s, unsigned variant, int depth);

capnp::DynamicValue::Reader scalar(capnp::Type type, unsigned variant) {
  switch (type.which()) {
    case capnp::schema::Type::BOOL: return true;
    case capnp::schema::Type::INT8:
    case capnp::schema::Type::INT16:
    case capnp::schema::Type::INT32:
    case capnp::schema::Type::INT64: return int64_t(1 + variant);
    case capnp::schema::Type::UINT8:
    case capnp::schema::Type::UINT16:
    case capnp::schema::Type::UINT32:
    case capnp::schema::Type::UINT64: return uint64_t(1 + variant);
    case capnp::schema::Type::FLOAT32:
    case capnp::schema::Type::FLOAT64: return 1.5;
    case capnp::schema::Type::TEXT: return capnp::Text::Reader("x");
    case capnp::schema::Type::DATA: {
      static const kj::byte data[] = {1, 2, 3};
      return capnp::Data::Reader(data, sizeof(data));
    }
    case capnp::schema::Type::ENUM: {
      auto enumerants = type.asEnum().getEnumerants();
      return capnp::DynamicEnum(enumerants[variant % enumerants.size()]);
    }
    default: return capnp::DynamicValue::Reader();
  }
}

void fill_list(capnp::DynamicList::Builder list, capnp::ListSchema schema, unsigned variant,
               int depth) {
  auto element = schema.getElementType();
  for (unsigned i = 0; i < list.size(); ++i) {
    switch (element.which()) {
      case capnp::schema::Type::STRUCT:
        fill(list[i].as<capnp::DynamicStruct>(), variant + i, depth + 1);
        break;
      case capnp::schema::Type::LIST: {
        auto inner = list.init(i, 1).as<capnp::DynamicList>();
        fill_list(inner, element.asList(), variant, depth + 1);
        break;
      }
      case capnp::schema::Type::VOID:
      case capnp::schema::Type::INTERFACE:
      case capnp::schema::Type::ANY_POINTER: break;
      default: list.set(i, scalar(element, variant + i));
    }
  }
}

void fill_field(capnp::DynamicStruct::Builder s, capnp::StructSchema::Field field,
                unsigned variant, int depth) {
  auto proto = field.getProto();
  if (proto.isGroup()) {
    fill(s.get(field).as<capnp::DynamicStruct>(), variant, depth + 1);
    return;
  }
  auto type = field.getType();
  switch (type.which()) {
    case capnp::schema::Type::VOID: s.set(field, capnp::VOID); break;
    case capnp::schema::Type::STRUCT:
      if (depth < max_depth)
        fill(s.init(field).as<capnp::DynamicStruct>(), variant, depth + 1);
      break;
    case capnp::schema::Type::LIST:
      if (depth < max_depth)
        fill_list(s.init(field, 2).as<capnp::DynamicList>(), type.asList(), variant, depth);
      break;
    case capnp::schema::Type::INTERFACE:
    case capnp::schema::Type::ANY_POINTER: break;
    default:
      if (field.getProto().getName() == "schemaVersion")
        s.set(field, uint64_t(schema::SCHEMA_VERSION));
      else
        s.set(field, scalar(type, variant));
  }
}

void fill(capnp::DynamicStruct::Builder s, unsigned variant, int depth) {
  auto schema = s.getSchema();
  for (auto field : schema.getNonUnionFields())
    fill_field(s, field, variant, depth);
  auto members = schema.getUnionFields();
  if (members.size() > 0)
    fill_field(s, members[variant % members.size()], variant / members.size(), depth);
}

}  // namespace

std::string sample_message(capnp::StructSchema type, unsigned variant) {
  capnp::MallocMessageBuilder message;
  fill(message.initRoot<capnp::DynamicStruct>(type), variant, 0);
  return messages::encode(message);
}

}  // namespace maxkernel::fuzz
