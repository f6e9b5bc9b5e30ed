// What the search so far says about a kind of move. Every edge of the history (a candidate
// and its parent, one template) is read as the parameters it changed with the direction of
// each change ("block_k+", "grid_order=n_major") and whether the child came out faster. A
// change tried from several candidates that never made one faster is a poor bet from the
// next: the planner offers it after the moves not known to hurt rather than spending the
// next evaluation on it again (mamba2_ssd's search grew block_t from each of its successive
// best candidates, slower every time).
#pragma once

#include "maxkernel/schema/agent.capnp.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

// Name/JSON-literal pairs (a candidate's params, a plan step's changes) as one JSON object;
// values that do not parse are left out.
nlohmann::json params_json(capnp::List<schema::Param>::Reader params);
inline nlohmann::json candidate_params(schema::Candidate::Reader c) {
  return params_json(c.getParams());
}

// The change from `parent` to `child`: the changed keys in key order, each "name+" or "name-"
// for a number that grew or shrank, "name=value" otherwise, joined by ','. The VMEM limit is
// left out (it follows the blocks); "" when nothing else changed.
std::string move_signature(const nlohmann::json& parent, const nlohmann::json& child);

struct move_record {
  unsigned tried = 0;   // edges of this kind from a correct, timed parent
  unsigned faster = 0;  // of those, children correct and strictly faster than their parent
};

// A change tried this many times and never faster is offered after the others.
inline constexpr unsigned kHurtAfter = 2;

// A change that made a candidate of the search faster than its parent: the values it set
// (absolute, the VMEM limit left out), to be tried on other candidates of the template. The
// graph search's branches find such changes from different parents; applied to another
// branch's best they give kernels no single move reaches (docs/agents.md, `mergeFinding`).
struct finding {
  std::string template_name;
  nlohmann::json changes;   // name -> the child's value, for each param that changed
  nlohmann::json before;    // name -> the parent's value (absent: the template's default)
  std::string child_id, parent_id;
  double parent_us = 0, child_us = 0;
  double gain() const { return parent_us > 0 ? 1.0 - child_us / parent_us : 0; }
};

class move_evidence {
public:
  move_evidence() = default;
  // Every edge of the history whose parent is in it, correct and timed; a candidate that
  // appears twice counts once, with its latest result.
  explicit move_evidence(capnp::List<schema::HistoryEntry>::Reader history);

  void add(const std::string& template_name, const std::string& signature, bool faster);
  move_record of(const std::string& template_name, const std::string& signature) const;
  // Tried at least kHurtAfter times, never faster.
  bool keeps_hurting(const std::string& template_name, const std::string& signature) const;
  // The history's findings of one template, largest gain first (ties: history order).
  std::vector<finding> findings(const std::string& template_name) const;

private:
  std::map<std::string, move_record> records_;
  std::vector<finding> findings_;
};

}  // namespace maxkernel::agents::expert
