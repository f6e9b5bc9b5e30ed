#include "messages/eval_request.hpp"

#include "messages/source_candidate.hpp"

namespace maxkernel::messages {

void build_eval_request(schema::EvalRequest::Builder request, schema::KernelSpec::Reader spec,
                        const std::string& source, const std::string& origin,
                        const request_settings& settings) {
  request.setSchemaVersion(schema::SCHEMA_VERSION);
  request.setSpec(spec);
  request.setReference(settings.reference);
  auto candidate = request.initCandidate();
  fill_source_candidate(candidate, source, "", "", origin, settings.candidate_id);
  if (settings.reference)
    candidate.setId("reference");
  auto options = request.initOptions();
  options.setFull(settings.full);
  options.setProfileOnly(settings.profile_only);
  if (!settings.value_mode.empty())
    options.setValueMode(settings.value_mode);
  options.setValueScale(settings.value_scale);
  if (!settings.shape_mode.empty())
    options.setShapeMode(settings.shape_mode);
  if (!settings.store_scope.empty())
    options.setStoreScope(settings.store_scope);
  if (settings.chip.empty())
    options.setChip(spec.getChip());
  else
    options.setChip(settings.chip);
  auto seeds = options.initSeeds(static_cast<unsigned>(settings.seeds.size()));
  for (unsigned i = 0; i < settings.seeds.size(); ++i)
    seeds.set(i, settings.seeds[i]);
}

}  // namespace maxkernel::messages
