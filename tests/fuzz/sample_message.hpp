// Small valid messages of any schema type, filled through capnp's dynamic API: the seeds of
// the fuzz corpora (every field set, one union member chosen by `variant`).
#pragma once

#include <capnp/schema.h>

#include <string>

namespace maxkernel::fuzz {

std::string sample_message(capnp::StructSchema type, unsigned variant);

}  // namespace maxkernel::fuzz
