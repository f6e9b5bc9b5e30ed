// A candidate that is a kernel source and nothing more (no template, no parameters): one an
// LLM wrote, an operator supplied or a command read from a file. Its id is the source's
// sha256, as every candidate's, so the same kernel is the same candidate whoever wrote it.
#pragma once

#include "maxkernel/schema/candidate.capnp.h"
#include "maxkernel/schema/common.capnp.h"

#include <string>

namespace maxkernel::messages {

// `id`: the source's sha256 when the caller has it already ("" = computed here).
void fill_source_candidate(schema::Candidate::Builder c, const std::string& source,
                           const std::string& parent_id, const std::string& strategy,
                           const std::string& origin, const std::string& id = {});

}  // namespace maxkernel::messages
