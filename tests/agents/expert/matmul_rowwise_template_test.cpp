// The matmul and rowwise templates on analyze summaries of small references
// (data/make_graphs.py): what they match and refuse, the facts render needs, first params
// that fit the chip, legal playbook children, deterministic rendering, parameter errors.
#include "agents/expert/playbook.hpp"
#include "agents/expert/template_registry.hpp"
#include "config/chip_loader.hpp"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <set>
#include <sstream>

namespace mx = maxkernel::agents::expert;
namespace schema = maxkernel::schema;

namespace {

struct task {
  std::unique_ptr<capnp::MallocMessageBuilder> graph_msg, spec_msg;
  std::unique_ptr<mx::graph_view> view;
  schema::KernelSpec::Reader spec;
};

// The graph of data/<name>.json and a spec whose inputs are the graph's, plus static
// arguments at the positions in `statics`.
task load(const std::string& name, std::set<unsigned> statics = {}) {
  std::ifstream in(std::string(MAXKERNEL_EXPERT_TEST_DATA) + "/" + name + ".json");
  std::stringstream text;
  text << in.rdbuf();
  task t;
  t.graph_msg = std::make_unique<capnp::MallocMessageBuilder>();
  auto root = t.graph_msg->initRoot<schema::DataflowGraph>();
  capnp::JsonCodec codec;
  codec.decode(kj::StringPtr(text.str().c_str()), root);
  t.view = std::make_unique<mx::graph_view>(root.asReader());
  t.spec_msg = std::make_unique<capnp::MallocMessageBuilder>();
  auto spec = t.spec_msg->initRoot<schema::KernelSpec>();
  spec.setName(name);
  auto conf = spec.initConfigurations(1)[0];
  unsigned total = t.view->input_count() + static_cast<unsigned>(statics.size());
  auto inputs = conf.initInputs(total);
  unsigned graph_input = 0;
  for (unsigned i = 0; i < total; ++i) {
    inputs[i].setName("a" + std::to_string(i));
    if (statics.count(i)) {
      inputs[i].setIsStatic(true);
      inputs[i].setStaticValue("1e-06");
      continue;
    }
    auto type = t.view->input_type(graph_input++);
    inputs[i].initType().setDtype(type.getDtype());
  }
  t.spec = spec.asReader();
  return t;
}

maxkernel::config::chip chip(const std::string& name) {
  maxkernel::config::chip c;
  maxkernel::config::spec_error e;
  EXPECT_TRUE(maxkernel::config::load_chip(name, c, e)) << e.what();
  return c;
}

std::optional<mx::template_match> match(const std::string& family, const task& t) {
  auto tmpl = mx::find_template(family);
  EXPECT_NE(tmpl, nullptr) << family;
  return tmpl ? tmpl->match(*t.view, t.spec) : std::nullopt;
}

// First params fit the chip; three distinct children that fit; rendering is deterministic.
void check_params_and_children(const std::string& family, const mx::template_match& m,
                               const std::string& chip_name) {
  auto tmpl = mx::find_template(family);
  auto c = chip(chip_name);
  auto params = tmpl->initial_params(m, c);
  EXPECT_LE(tmpl->vmem_bytes(m, params), mx::vmem_limit(params, c)) << params.dump();
  EXPECT_LE(mx::vmem_limit(params, c), static_cast<int64_t>(c.vmem_bytes));
  std::string a, b, error;
  ASSERT_TRUE(tmpl->render(m, params, a, error)) << error;
  ASSERT_TRUE(tmpl->render(m, params, b, error)) << error;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.rfind("# maxkernel expert template: " + family, 0), 0u);
  auto moves = mx::playbook_moves(*tmpl, m, params, c, nullptr, {});
  std::set<std::string> distinct;
  for (const auto& mv : moves) {
    EXPECT_LE(tmpl->vmem_bytes(m, mv.params), mx::vmem_limit(mv.params, c)) << mv.name;
    std::string src;
    EXPECT_TRUE(tmpl->render(m, mv.params, src, error)) << error;
    distinct.insert(mv.params.dump());
  }
  EXPECT_GE(distinct.size(), 3u) << family << " on " << chip_name;
}

}  // namespace

TEST(MatmulTemplate, EpilogueWithRowSoftmaxTakesWholeRows) {
  auto t = load("matmul_bias_gelu_softmax");
  auto m = match("matmul", t);
  ASSERT_TRUE(m);
  const auto& cfg = m->facts["config"];
  EXPECT_EQ(cfg["mode"], "row");
  EXPECT_EQ(cfg["mat_layouts"], (nlohmann::json{"mk", "kn"}));
  EXPECT_EQ(cfg["extras"].size(), 1u);  // the bias
  EXPECT_EQ(cfg["extras"][0], (nlohmann::json{false, false, true}));
  // no block_n in row mode: a block holds the whole row
  for (const auto& tu : mx::find_template("matmul")->tunables(*m))
    EXPECT_NE(tu.name, "block_n");
  check_params_and_children("matmul", *m, "v6e");
  check_params_and_children("matmul", *m, "v5e");
  EXPECT_FALSE(match("rowwise", t));  // a matmul is not row-wise
}

TEST(MatmulTemplate, CrossEntropyStreamsOverN) {
  auto t = load("cross_entropy");
  auto m = match("matmul", t);
  ASSERT_TRUE(m);
  const auto& cfg = m->facts["config"];
  EXPECT_EQ(cfg["mode"], "stream");
  EXPECT_EQ(cfg["stream_accs"].size(), 3u);
  bool found = false;
  for (const auto& tu : mx::find_template("matmul")->tunables(*m))
    if (tu.name == "block_n") {
      found = true;
      EXPECT_TRUE(tu.reduction);  // statistics carried across N blocks
      EXPECT_EQ(tu.extent, 4096);
    }
  EXPECT_TRUE(found);
  check_params_and_children("matmul", *m, "v6e");
}

TEST(MatmulTemplate, TransposedWeightScalarAndRowOperands) {
  auto t = load("residual_per_row_scalar");
  auto m = match("matmul", t);
  ASSERT_TRUE(m);
  const auto& cfg = m->facts["config"];
  EXPECT_EQ(cfg["mat_layouts"], (nlohmann::json{"mk", "nk"}));  // x @ w.T read in place
  EXPECT_EQ(cfg["outputs"].size(), 2u);
  int scalars = 0;
  for (const auto& e : cfg["extras"])
    scalars += e.is_null();
  EXPECT_EQ(scalars, 1);
  EXPECT_EQ(cfg["mode"], "row");  // the tile output and the row max together need whole rows
  check_params_and_children("matmul", *m, "v5p");
}

// A norm per 128-wide head ("mk,khd->mhd"): a column block holds whole heads, so the dot is
// as wide as the MXU; the VMEM estimate grows with the heads per block.
TEST(MatmulTemplate, LaneAlignedHeadsShareAColumnBlock) {
  auto t = load("headnorm_128");
  auto m = match("matmul", t);
  ASSERT_TRUE(m);
  const auto& cfg = m->facts["config"];
  EXPECT_EQ(cfg["mode"], "group");
  EXPECT_TRUE(cfg["group_blocks"].get<bool>());
  auto tmpl = mx::find_template("matmul");
  bool found = false;
  for (const auto& tu : tmpl->tunables(*m))
    if (tu.name == "block_n") {
      found = true;
      EXPECT_EQ(tu.extent, 1024);  // 8 heads of 128
      EXPECT_EQ(tu.align, 128);    // whole heads
    }
  EXPECT_TRUE(found);
  auto params = tmpl->initial_params(*m, chip("v6e"));
  EXPECT_GT(params["block_n"].get<int64_t>(), 128) << params.dump();  // the 256-wide MXU
  auto one = params, four = params;
  one["block_n"] = 128;
  four["block_n"] = 512;
  EXPECT_LT(tmpl->vmem_bytes(*m, one), tmpl->vmem_bytes(*m, four));
  check_params_and_children("matmul", *m, "v6e");
}

// Heads of 64 lanes are not lane-aligned slices: one head per block, no block_n.
TEST(MatmulTemplate, NarrowHeadsStayOnePerBlock) {
  auto t = load("headnorm_64");
  auto m = match("matmul", t);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->facts["config"]["mode"], "group");
  EXPECT_FALSE(m->facts["config"]["group_blocks"].get<bool>());
  auto tmpl = mx::find_template("matmul");
  for (const auto& tu : tmpl->tunables(*m))
    EXPECT_NE(tu.name, "block_n");
  auto one = tmpl->initial_params(*m, chip("v6e")), four = one;
  one["block_n"] = 64;
  four["block_n"] = 256;
  EXPECT_EQ(tmpl->vmem_bytes(*m, one), tmpl->vmem_bytes(*m, four));  // block_n is not used
}

TEST(MatmulTemplate, RenderNamesBadParams) {
  auto t = load("matmul_bias_gelu_softmax");
  auto m = match("matmul", t);
  ASSERT_TRUE(m);
  auto tmpl = mx::find_template("matmul");
  auto params = tmpl->initial_params(*m, chip("v6e"));
  params["block_k"] = 0;
  std::string src, error;
  EXPECT_FALSE(tmpl->render(*m, params, src, error));
  EXPECT_NE(error.find("block_k"), std::string::npos) << error;
  params = tmpl->initial_params(*m, chip("v6e"));
  params["grid_order"] = "diagonal";
  EXPECT_FALSE(tmpl->render(*m, params, src, error));
  EXPECT_NE(error.find("grid_order"), std::string::npos) << error;
}

TEST(RowwiseTemplate, RmsnormOverMergedRows) {
  auto t = load("rmsnorm_3d", {2});
  auto m = match("rowwise", t);
  ASSERT_TRUE(m);
  const auto& cfg = m->facts["config"];
  EXPECT_EQ(cfg["mode"], "row");
  EXPECT_EQ(m->facts["sizes"]["R"], 1024);
  EXPECT_EQ(m->facts["sizes"]["D"], 512);
  EXPECT_NE(m->facts["prep"].get<std::string>().find("(a0.shape[0] * a0.shape[1])"),
            std::string::npos)
      << m->facts["prep"];
  EXPECT_FALSE(match("matmul", t));
  check_params_and_children("rowwise", *m, "v6e");
}

TEST(Templates, RefuseWhatTheGeneratorCannotExpress) {
  auto t = load("cumsum_after_matmul");
  EXPECT_FALSE(match("matmul", t));
  EXPECT_FALSE(match("rowwise", t));
}

TEST(Templates, MatmulPoolsMaxoutGroups) {
  auto t = load("maxout_after_matmul");
  auto m = match("matmul", t);
  ASSERT_TRUE(m);
  const auto& cfg = m->facts["config"];
  EXPECT_EQ(cfg["mode"], "tile");
  EXPECT_EQ(cfg["pool"], 4);
  EXPECT_EQ(cfg["align"][1], 512);  // bn / 4 a multiple of 128 lanes
  EXPECT_NE(m->summary.find("pooled by 4"), std::string::npos) << m->summary;
  check_params_and_children("matmul", *m, "v6e");
}

TEST(Playbook, CoreSplitsAreExploredOnlyWhereTheDeviceHasTwoCores) {
  auto t = load("maxout_after_matmul");
  auto m = match("matmul", t);
  ASSERT_TRUE(m);
  auto tmpl = mx::find_template("matmul");
  auto splits = [&](const std::string& chip_name) {
    auto c = chip(chip_name);
    int n = 0;
    for (const auto& mv : mx::playbook_moves(*tmpl, *m, tmpl->initial_params(*m, c), c,
                                             nullptr, {}))
      n += mv.changes.contains("dimension_semantics");
    return n;
  };
  // v6e: one TensorCore, "arbitrary" compiles to the parent's schedule; v5p: a megacore
  // device, where "parallel" axes are split across its two cores.
  EXPECT_EQ(splits("v6e"), 0);
  EXPECT_EQ(splits("v5e"), 0);
  EXPECT_GT(splits("v5p"), 0);
}
