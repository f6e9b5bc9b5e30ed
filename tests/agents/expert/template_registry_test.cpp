// Every template family against every analyze summary the expert tests keep (the *_data
// directories, written by their make_graphs.py): what each family promises of its first
// point, whichever reference it matched. A first point the playbook cannot move from (a
// block tunable left out of the params reads as the whole axis, so no move is offered: how
// attention_backward's block_b went unsearched) or that does not fit its VMEM limit fails
// here for any family, not only in the family's own tests.
#include "agents/expert/param_check.hpp"
#include "agents/expert/playbook.hpp"
#include "agents/expert/template_registry.hpp"
#include "config/chip_loader.hpp"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

namespace mx = maxkernel::agents::expert;
namespace fs = std::filesystem;

namespace {

struct fixture {
  std::string name;
  std::unique_ptr<capnp::MallocMessageBuilder> message, spec_message;
  std::unique_ptr<mx::graph_view> view;
  maxkernel::schema::KernelSpec::Reader spec;
};

// The graph, and a native spec with one array input per graph input (as the family tests).
std::unique_ptr<fixture> load(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  auto f = std::make_unique<fixture>();
  f->name = path.parent_path().filename().string() + "/" + path.stem().string();
  f->message = std::make_unique<capnp::MallocMessageBuilder>();
  auto root = f->message->initRoot<maxkernel::schema::DataflowGraph>();
  capnp::JsonCodec codec;
  codec.decode(kj::StringPtr(text.str().c_str()), root);
  f->view = std::make_unique<mx::graph_view>(root.asReader());
  f->spec_message = std::make_unique<capnp::MallocMessageBuilder>();
  auto spec = f->spec_message->initRoot<maxkernel::schema::KernelSpec>();
  spec.setName(path.stem().string());
  auto inputs = spec.initConfigurations(1)[0].initInputs(f->view->input_count());
  for (unsigned k = 0; k < f->view->input_count(); ++k) {
    inputs[k].setName("x" + std::to_string(k));
    inputs[k].setType(f->view->input_type(k));
  }
  f->spec = spec.asReader();
  return f;
}

std::vector<std::unique_ptr<fixture>> all_fixtures() {
  std::vector<fs::path> paths;
  for (auto& dir : fs::directory_iterator(MAXKERNEL_EXPERT_TEST_ROOT))
    if (dir.is_directory() && (dir.path().filename() == "data"
                               || dir.path().filename().string().ends_with("_data")))
      for (auto& file : fs::directory_iterator(dir.path()))
        if (file.path().extension() == ".json")
          paths.push_back(file.path());
  std::sort(paths.begin(), paths.end());
  std::vector<std::unique_ptr<fixture>> out;
  for (auto& p : paths)
    out.push_back(load(p));
  return out;
}

maxkernel::config::chip chip_named(const std::string& name) {
  maxkernel::config::chip c;
  maxkernel::config::spec_error err;
  EXPECT_TRUE(maxkernel::config::load_chip(name, c, err)) << name;
  return c;
}

}  // namespace

TEST(TemplateRegistry, EveryFirstPointIsSearchableRendersAndFits) {
  auto fixtures = all_fixtures();
  ASSERT_GE(fixtures.size(), 40u);  // the five data directories
  std::set<std::string> families;
  for (const std::string chip_name : {"v5e", "v6e"}) {
    auto chip = chip_named(chip_name);
    for (auto& f : fixtures) {
      for (auto& m : mx::match_templates(*f->view, f->spec)) {
        std::string where = chip_name + " " + f->name + " " + m.tmpl->name();
        families.insert(m.tmpl->name());
        auto params = m.tmpl->initial_params(m.match, chip);
        std::string error;
        EXPECT_TRUE(mx::check_param_types(*m.tmpl, m.match, params, error)) << where << ": " << error;
        for (auto& t : m.tmpl->tunables(m.match)) {
          if (t.what != mx::tunable::kind::block)
            continue;
          // Left out, the playbook reads the whole axis and offers no move along it. (Any
          // positive size is legal: kernels use effective_block's divisor of the extent.)
          ASSERT_TRUE(params.contains(t.name)) << where << ": " << t.name << " not in "
                                               << params.dump();
        }
        auto limit = params.value("vmem_limit_bytes",
                                  static_cast<int64_t>(chip.scoped_vmem_bytes));
        EXPECT_LE(m.tmpl->vmem_bytes(m.match, params), limit) << where << " " << params.dump();
        std::string source;
        EXPECT_TRUE(m.tmpl->render(m.match, params, source, error)) << where << ": " << error;
        // And the playbook has somewhere to go from it.
        EXPECT_FALSE(mx::playbook_moves(*m.tmpl, m.match, params, chip, nullptr, {}).empty())
          << where << " " << params.dump();
      }
    }
  }
  // Most families are met by some fixture (a family none matches is tested nowhere here).
  EXPECT_GE(families.size(), 10u) << ::testing::PrintToString(families);
}
