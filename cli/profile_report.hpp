// A Profile (modeled or measured) as JSON and as readable lines.
#pragma once

#include "maxkernel/schema/profile.capnp.h"

#include <nlohmann/json.hpp>

#include <string>

namespace maxkernel::cli {

const char* timing_name(schema::Profile::Reader profile);  // "modeled" | "measured"
nlohmann::json profile_json(schema::Profile::Reader profile);
// Indented lines: time, breakdown, bound, utilisation, VMEM, per call, notes.
std::string profile_summary(schema::Profile::Reader profile, const std::string& indent);

}  // namespace maxkernel::cli
