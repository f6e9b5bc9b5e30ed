#include "messages/source_candidate.hpp"

#include "messages/content_hash.hpp"

namespace maxkernel::messages {

void fill_source_candidate(schema::Candidate::Builder c, const std::string& source,
                           const std::string& parent_id, const std::string& strategy,
                           const std::string& origin, const std::string& id) {
  c.setSchemaVersion(schema::SCHEMA_VERSION);
  c.setId(id.empty() ? sha256_hex(source) : id);
  c.setSource(source);
  c.initParams(0);
  c.setParentId(parent_id);
  c.setStrategy(strategy);
  c.setOrigin(origin);
  c.setTemplate("");
}

}  // namespace maxkernel::messages
