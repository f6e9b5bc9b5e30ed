#include "cli/template_command.hpp"

#include "agents/expert/param_check.hpp"
#include "agents/expert/playbook.hpp"
#include "agents/expert/template_registry.hpp"
#include "cli/node_evaluation.hpp"
#include "cli/output_file.hpp"
#include "cli/task_session.hpp"
#include "config/chip_loader.hpp"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/capnp_io.hpp"

#include <capnp/message.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>

namespace maxkernel::cli {

namespace ex = agents::expert;

int run_template(const template_options& opts) {
  std::ostream& human = opts.json == "-" ? std::cerr : std::cout;
  std::string error;
  auto kind = classify_spec(opts.spec, error);
  if (kind == spec_kind::invalid) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  nlohmann::json overrides = nlohmann::json::object();
  if (!opts.params.empty()) {
    overrides = nlohmann::json::parse(opts.params, nullptr, false);
    if (!overrides.is_object()) {
      std::cerr << "error: --params: not a JSON object: " << opts.params << "\n";
      return 2;
    }
  }
  if (!output_dir_exists(opts.json, error) || !output_dir_exists(opts.out, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  task_session task;
  session_flags flags{opts.chip, opts.state_dir, false, 0, opts.memory_limit_bytes,
                      opts.deadline_seconds};
  if (int code = open_task_session(opts.spec, kind, flags, task))
    return code;
  auto spec = task.spec();
  std::string chip_name = opts.chip.empty() ? spec.getChip().cStr() : opts.chip;
  config::chip chip;
  config::spec_error chip_err;
  if (!config::load_chip(chip_name, chip, chip_err)) {
    std::cerr << "error: --chip: " << chip_err.what() << "\n";
    return 2;
  }
  std::optional<messages::decoded_message> graph_msg;  // readable many times (matchers)
  if (int code = analyze_reference(*task.session, spec, graph_msg, error)) {
    std::cerr << "error: " << error << "\n";
    return code;
  }
  ex::graph_view graph(graph_msg->root<schema::DataflowGraph>());
  auto matches = ex::match_templates(graph, spec);
  nlohmann::json out = {{"task", spec.getName().cStr()}, {"chip", chip_name},
                        {"matches", nlohmann::json::array()}};
  human << fmt::format("task {}: {} template(s) match\n", spec.getName().cStr(), matches.size());
  for (const auto& m : matches) {
    human << fmt::format("  {:<22} score {:.2f}  {}\n", m.tmpl->name(), m.match.score,
                         m.match.summary);
    out["matches"].push_back({{"template", m.tmpl->name()}, {"score", m.match.score},
                              {"summary", m.match.summary}});
  }
  const ex::matched_template* chosen = nullptr;
  for (const auto& m : matches)
    if (opts.name.empty() || m.tmpl->name() == opts.name) {
      chosen = &m;
      break;
    }
  int code = 0;
  if (!chosen) {
    human << (opts.name.empty() ? "no template applies\n"
                                : fmt::format("template {} does not match\n", opts.name));
    code = 2;
  } else {
    auto params = chosen->tmpl->initial_params(chosen->match, chip);
    for (const auto& [k, v] : overrides.items())
      params[k] = v;
    if (!ex::check_param_types(*chosen->tmpl, chosen->match, params, error)) {
      std::cerr << "error: --params: " << error << "\n";
      return 2;
    }
    auto vmem = chosen->tmpl->vmem_bytes(chosen->match, params);
    // the limit the kernel asks for, else the chip's default scoped limit
    auto limit = params.value("vmem_limit_bytes", static_cast<int64_t>(chip.scoped_vmem_bytes));
    human << fmt::format("{}: params {}  VMEM {:.1f} MiB (scoped limit {:.1f} MiB)\n",
                         chosen->tmpl->name(), params.dump(), vmem / 1048576.0,
                         limit / 1048576.0);
    std::string source;
    if (!chosen->tmpl->render(chosen->match, params, source, error)) {
      std::cerr << "error: render: " << error << "\n";
      code = 2;
    } else if (!opts.out.empty()) {
      std::ofstream f(opts.out);
      f << source;
      if (!f) {
        std::cerr << "error: cannot write " << opts.out << "\n";
        return 3;
      }
      human << "wrote " << opts.out << "\n";
    } else if (opts.json != "-") {
      std::cout << source;
    }
    if (!opts.children_dir.empty() && code == 0) {
      std::error_code ec;
      std::filesystem::create_directories(opts.children_dir, ec);
      auto moves = ex::playbook_moves(*chosen->tmpl, chosen->match, params, chip, nullptr, {});
      out["children"] = nlohmann::json::array();
      for (unsigned i = 0; i < moves.size() && i < opts.children; ++i) {
        std::string child_source;
        if (!chosen->tmpl->render(chosen->match, moves[i].params, child_source, error)) {
          std::cerr << "error: render child " << i + 1 << ": " << error << "\n";
          return 3;
        }
        auto path = std::filesystem::path(opts.children_dir) / fmt::format("child_{}.py", i + 1);
        std::ofstream f(path);
        f << child_source;
        if (!f) {
          std::cerr << "error: cannot write " << path.string() << "\n";
          return 3;
        }
        human << fmt::format("  child {}: {} {}: {}\n", i + 1, moves[i].name,
                             moves[i].changes.dump(), moves[i].expected_effect);
        out["children"].push_back({{"file", path.string()}, {"move", moves[i].name},
                                   {"changes", moves[i].changes},
                                   {"expected_effect", moves[i].expected_effect}});
      }
    }
    out["template"] = chosen->tmpl->name();
    out["params"] = params;
    out["vmem_bytes"] = vmem;
    out["facts"] = chosen->match.facts;
  }
  if (!opts.json.empty() && !write_output(opts.json, out.dump(2) + "\n", error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return code;
}

}  // namespace maxkernel::cli
