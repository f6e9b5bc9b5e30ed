#include "agents/expert/move_evidence.hpp"

#include <algorithm>
#include <optional>
#include <set>

namespace maxkernel::agents::expert {

namespace {

constexpr const char* kVmemLimitKey = "vmem_limit_bytes";

std::string key(const std::string& template_name, const std::string& signature) {
  return template_name + "\n" + signature;
}

// The time of a correct, profiled result; nullopt otherwise.
std::optional<double> timed(schema::EvalResult::Reader r) {
  if (!r.getCorrect() || !r.getHasProfile() || r.getProfile().getTimeUs() <= 0)
    return std::nullopt;
  return r.getProfile().getTimeUs();
}

}  // namespace

nlohmann::json params_json(capnp::List<schema::Param>::Reader params) {
  nlohmann::json p = nlohmann::json::object();
  for (auto param : params) {
    auto v = nlohmann::json::parse(param.getValue().cStr(), nullptr, false);
    if (!v.is_discarded())
      p[param.getName().cStr()] = v;
  }
  return p;
}

std::string move_signature(const nlohmann::json& parent, const nlohmann::json& child) {
  if (!parent.is_object() || !child.is_object())
    return "";
  std::set<std::string> keys;
  for (const auto& [k, v] : parent.items())
    keys.insert(k);
  for (const auto& [k, v] : child.items())
    keys.insert(k);
  std::string out;
  for (const auto& k : keys) {
    if (k == kVmemLimitKey)
      continue;
    auto a = parent.find(k);
    auto b = child.find(k);
    if (a != parent.end() && b != child.end() && *a == *b)
      continue;
    std::string part;
    if (b == child.end())
      part = k + "=default";
    else if (a != parent.end() && a->is_number() && b->is_number())
      part = k + (b->get<double>() > a->get<double>() ? "+" : "-");
    else
      part = k + "=" + b->dump();
    out += (out.empty() ? "" : ",") + part;
  }
  return out;
}

move_evidence::move_evidence(capnp::List<schema::HistoryEntry>::Reader history) {
  // The latest entry of each candidate id, its params read once.
  std::map<std::string, unsigned> latest;
  for (unsigned i = 0; i < history.size(); ++i)
    latest[history[i].getCandidate().getId().cStr()] = i;
  std::map<unsigned, nlohmann::json> params;
  for (const auto& [id, i] : latest)
    params[i] = candidate_params(history[i].getCandidate());
  // In history order (the keys of `params`), so that findings of equal gain keep the search's.
  for (const auto& [i, child_params] : params) {
    auto child = history[i].getCandidate();
    auto p = latest.find(child.getParentId().cStr());
    if (child.getParentId().size() == 0 || p == latest.end())
      continue;
    auto parent = history[p->second].getCandidate();
    if (child.getTemplate().size() == 0 ||
        std::string(child.getTemplate().cStr()) != parent.getTemplate().cStr())
      continue;
    auto parent_us = timed(history[p->second].getResult());
    if (!parent_us)
      continue;
    const auto& from = params.at(p->second);
    auto sig = move_signature(from, child_params);
    if (sig.empty())
      continue;
    auto child_us = timed(history[i].getResult());
    bool faster = child_us && *child_us < *parent_us;
    add(child.getTemplate().cStr(), sig, faster);
    if (!faster)
      continue;
    finding f{child.getTemplate().cStr(), nlohmann::json::object(), nlohmann::json::object(),
              child.getId().cStr(), parent.getId().cStr(), *parent_us, *child_us};
    for (const auto& [k, v] : child_params.items())
      if (k != kVmemLimitKey && (!from.contains(k) || from[k] != v)) {
        f.changes[k] = v;
        if (from.contains(k))
          f.before[k] = from[k];
      }
    if (!f.changes.empty())
      findings_.push_back(std::move(f));
  }
  std::stable_sort(findings_.begin(), findings_.end(),
                   [](const finding& a, const finding& b) { return a.gain() > b.gain(); });
}

std::vector<finding> move_evidence::findings(const std::string& template_name) const {
  std::vector<finding> out;
  for (const auto& f : findings_)
    if (f.template_name == template_name)
      out.push_back(f);
  return out;
}

void move_evidence::add(const std::string& template_name, const std::string& signature,
                        bool faster) {
  auto& r = records_[key(template_name, signature)];
  ++r.tried;
  if (faster)
    ++r.faster;
}

move_record move_evidence::of(const std::string& template_name,
                              const std::string& signature) const {
  auto it = records_.find(key(template_name, signature));
  return it == records_.end() ? move_record{} : it->second;
}

bool move_evidence::keeps_hurting(const std::string& template_name,
                                  const std::string& signature) const {
  auto r = of(template_name, signature);
  return r.tried >= kHurtAfter && r.faster == 0;
}

}  // namespace maxkernel::agents::expert
