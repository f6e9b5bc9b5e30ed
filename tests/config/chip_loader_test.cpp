// Chip files: the shipped generations load with consistent values, every file in bad_chips/
// fails naming its field and line, MAXKERNEL_CHIPS_DIR adds generations without code, and
// fitted_chip_yaml rewrites only the efficiency values.
#include "temp_spec_dir.hpp"

#include "config/chip_loader.hpp"
#include "config/chip_names.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace maxkernel::config::test {
namespace {

namespace fs = std::filesystem;

const std::string shipped_dir = MAXKERNEL_SOURCE_DIR "/config/chips";

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << "no '" << from << "' in the text";
  if (pos != std::string::npos)
    text.replace(pos, from.size(), to);
  return text;
}

// Sets MAXKERNEL_CHIPS_DIR for the scope of a test and restores what was there.
class chips_dir_override {
public:
  explicit chips_dir_override(const std::string& dir) {
    if (const char* old = std::getenv("MAXKERNEL_CHIPS_DIR"))
      old_ = old;
    setenv("MAXKERNEL_CHIPS_DIR", dir.c_str(), 1);
  }
  ~chips_dir_override() {
    if (old_)
      setenv("MAXKERNEL_CHIPS_DIR", old_->c_str(), 1);
    else
      unsetenv("MAXKERNEL_CHIPS_DIR");
  }
  chips_dir_override(const chips_dir_override&) = delete;
  chips_dir_override& operator=(const chips_dir_override&) = delete;

private:
  std::optional<std::string> old_;
};

// The tests read the shipped files unless they say otherwise.
class ShippedChips : public ::testing::Test {
protected:
  chips_dir_override dir_{shipped_dir};

  chip load_ok(const std::string& name) {
    chip c;
    spec_error error;
    EXPECT_TRUE(load_chip(name, c, error)) << error.what();
    return c;
  }
};

TEST_F(ShippedChips, NamesAreTheFilesInTheSourceTree) {
  EXPECT_EQ(chips_dir(), shipped_dir);
  EXPECT_EQ(chip_names(), (std::vector<std::string>{"v4", "v5e", "v5p", "v6e", "v7x"}));
  EXPECT_TRUE(is_known_chip("v6e"));
  EXPECT_FALSE(is_known_chip("v6"));
  EXPECT_FALSE(is_known_chip("../chips/v6e"));
  EXPECT_FALSE(is_known_chip(""));
}

TEST_F(ShippedChips, EveryChipLoadsWithConsistentValues) {
  for (const auto& name : chip_names()) {
    SCOPED_TRACE(name);
    chip c = load_ok(name);
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(fs::path(c.source_path), fs::path(shipped_dir) / (name + ".yaml"));
    EXPECT_LE(c.scoped_vmem_bytes, c.vmem_bytes);
    EXPECT_LT(c.smem_bytes, c.vmem_bytes);
    EXPECT_GT(c.hbm_bytes, uint64_t{8} << 30);
    EXPECT_EQ(c.megacore, c.cores_per_device == 2);
    EXPECT_EQ(c.sublanes, 8u);
    EXPECT_EQ(c.lanes, 128u);
    // Integer and fp8 paths are never slower than bf16 where the chip has them.
    if (c.int8_ops > 0) {
      EXPECT_GE(c.int8_ops, c.bf16_flops);
    }
    if (c.fp8_flops > 0) {
      EXPECT_GE(c.fp8_flops, c.bf16_flops);
    }
    // The VPU does roughly a tenth or less of the MXU's work (scaling book, v5p: ~1.4e13 vs
    // 4.6e14), and the estimate is the stated derivation: clock x 8 x 128 x VALU slots x
    // TensorCores, with 2 or 4 slots.
    EXPECT_LT(c.vpu_flops * 10, c.bf16_flops);
    double per_slot =
        c.clock_hz * c.sublanes * c.lanes * c.devices_per_chip * c.cores_per_device;
    double slots = c.vpu_flops / per_slot;
    EXPECT_TRUE(std::abs(slots - 2) < 1e-6 || std::abs(slots - 4) < 1e-6) << slots;
    EXPECT_NEAR(c.transcendentals / per_slot, 1.0, 1e-6);
    // An ICI link is far slower than HBM.
    EXPECT_LT(c.ici_link_bandwidth * 10, c.hbm_bandwidth);
  }
}

TEST_F(ShippedChips, LayoutFollowsTpuInfo) {
  struct layout {
    unsigned devices, cores, mxu_size;
    bool megacore, packed;
  };
  const std::map<std::string, layout> expected{
      {"v4", {1, 2, 128, true, false}},  {"v5e", {1, 1, 128, false, false}},
      {"v5p", {1, 2, 128, true, false}}, {"v6e", {1, 1, 256, false, false}},
      {"v7x", {2, 1, 256, false, true}},
  };
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE(name);
    chip c = load_ok(name);
    EXPECT_EQ(c.devices_per_chip, want.devices);
    EXPECT_EQ(c.cores_per_device, want.cores);
    EXPECT_EQ(c.megacore, want.megacore);
    EXPECT_EQ(c.mxu_size, want.mxu_size);
    EXPECT_EQ(c.packed_sublane_tiling, want.packed);
  }
  // v7x: each of the two devices gets half the chip.
  chip v7x = load_ok("v7x");
  EXPECT_DOUBLE_EQ(v7x.bf16_flops * v7x.device_share(), 1.155e15);
}

TEST_F(ShippedChips, V5eRooflineCrossoverIsAbout240FlopPerByte) {
  chip c = load_ok("v5e");
  double crossover = c.bf16_flops / c.hbm_bandwidth;
  EXPECT_GT(crossover, 230);
  EXPECT_LT(crossover, 250);
  EXPECT_EQ(c.vmem_bytes, 128u << 20);
  EXPECT_EQ(c.hbm_bytes, uint64_t{16} << 30);
}

TEST_F(ShippedChips, UnknownNameListsTheKnownOnesWithAHint) {
  chip c;
  c.name = "untouched";
  spec_error error;
  EXPECT_FALSE(load_chip("v6", c, error));
  EXPECT_EQ(c.name, "untouched");
  EXPECT_EQ(error.field, "chip");
  EXPECT_NE(error.message.find("did you mean 'v6e'?"), std::string::npos) << error.what();
  EXPECT_NE(error.message.find("v4, v5e, v5p, v6e, v7x"), std::string::npos) << error.what();
  // A name that is a path is just an unknown chip.
  EXPECT_FALSE(load_chip("../chips/v6e", c, error));
  EXPECT_EQ(error.field, "chip");
}

TEST(ChipsDir, AnExtraGenerationFileIsAChipWithoutCode) {
  temp_spec_dir dir;
  for (const auto& entry : fs::directory_iterator(shipped_dir))
    fs::copy_file(entry.path(), dir.path() / entry.path().filename());
  std::string v9z = replace_once(read_all(fs::path(shipped_dir) / "v6e.yaml"), "name: v6e",
                                 "name: v9z");
  v9z = replace_once(v9z, "bf16_flops: 9.2e14", "bf16_flops: 5e15");
  dir.write("v9z.yaml", v9z);
  dir.write("notes.txt", "not a chip");
  dir.write(".hidden.yaml", "name: .hidden\n");

  chips_dir_override override(dir.path().string());
  EXPECT_EQ(chips_dir(), dir.path().string());
  EXPECT_EQ(chip_names(), (std::vector<std::string>{"v4", "v5e", "v5p", "v6e", "v7x", "v9z"}));
  EXPECT_TRUE(is_known_chip("v9z"));

  chip c;
  spec_error error;
  ASSERT_TRUE(load_chip("v9z", c, error)) << error.what();
  EXPECT_EQ(c.name, "v9z");
  EXPECT_EQ(c.bf16_flops, 5e15);
  EXPECT_EQ(c.source_path, (dir.path() / "v9z.yaml").string());

  // A native spec may target it.
  std::string spec = dir.write("spec/spec.yaml", R"(name: add
dims: {N: 128}
inputs:
  - {name: x, shape: [N], dtype: float32}
reference: |
  def reference(x):
      return x + 1
chip: v9z
)");
  load_result r;
  load(spec, r);
  ASSERT_TRUE(r.ok) << r.error.what();
  EXPECT_EQ(std::string(r.spec.asReader().getChip()), "v9z");
}

TEST(ChipsDir, AnEmptyDirectoryIsAClearError) {
  temp_spec_dir dir;
  chips_dir_override override(dir.path().string());
  EXPECT_TRUE(chip_names().empty());
  chip c;
  spec_error error;
  EXPECT_FALSE(load_chip("v6e", c, error));
  EXPECT_NE(error.message.find("no chip files"), std::string::npos) << error.what();
  EXPECT_NE(error.message.find("MAXKERNEL_CHIPS_DIR"), std::string::npos) << error.what();
}

TEST(ChipsDir, EachFileIsReadOncePerDirectory) {
  temp_spec_dir dir;
  std::string text = replace_once(read_all(fs::path(shipped_dir) / "v5e.yaml"), "name: v5e",
                                   "name: cached");
  std::string path = dir.write("cached.yaml", text);
  chips_dir_override override(dir.path().string());

  chip first;
  spec_error error;
  ASSERT_TRUE(load_chip("cached", first, error)) << error.what();
  // Break the file on disk: the cached chip is still served, so it was not read again.
  dir.write("cached.yaml", "name: [broken\n");
  chip second;
  ASSERT_TRUE(load_chip("cached", second, error)) << error.what();
  EXPECT_EQ(second.bf16_flops, first.bf16_flops);
  EXPECT_EQ(second.source_path, path);
  // Reading the file itself does see the change.
  chip direct;
  EXPECT_FALSE(load_chip_file(path, direct, error));
  EXPECT_EQ(error.field, "(document)");
}

// ---- The bad_chips corpus -----------------------------------------------------------------

std::vector<std::string> bad_chip_files() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(MAXKERNEL_BAD_CHIPS_DIR))
    if (entry.path().extension() == ".yaml")
      files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  return files;
}

// The first line reads `# expect: FIELD`; an optional second `# message: TEXT` is a part of
// the message.
std::pair<std::string, std::string> expectation(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  auto after = [](const std::string& line, const std::string& prefix) {
    return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : std::string{};
  };
  return {after(first, "# expect: "), after(second, "# message: ")};
}

class BadChip : public ::testing::TestWithParam<std::string> {};

TEST_P(BadChip, FailsNamingTheFieldAndLine) {
  fs::path file = fs::path(MAXKERNEL_BAD_CHIPS_DIR) / GetParam();
  auto [field, message] = expectation(file);
  ASSERT_FALSE(field.empty()) << file << " lacks its `# expect: FIELD` first line";
  chip c;
  c.name = "untouched";
  spec_error error;
  ASSERT_FALSE(load_chip_file(file.string(), c, error)) << file << " loaded";
  EXPECT_EQ(c.name, "untouched");
  EXPECT_EQ(error.field, field) << error.what();
  EXPECT_EQ(error.file, file.string());
  EXPECT_GT(error.line, 0) << error.what();
  EXPECT_GT(error.column, 0) << error.what();
  EXPECT_NE(error.what().find(":" + std::to_string(error.line) + ":"), std::string::npos);
  if (!message.empty()) {
    EXPECT_NE(error.message.find(message), std::string::npos)
        << "wanted '" << message << "' in: " << error.what();
  }
}

TEST(BadChipCorpus, CoversTheRequiredCases) {
  auto files = bad_chip_files();
  for (const char* required :
       {"missing_field.yaml", "unknown_field.yaml", "wrong_type_string.yaml",
        "negative_rate.yaml", "efficiency_above_one.yaml", "name_mismatch.yaml",
        "scoped_above_vmem.yaml", "stray_comma.yaml", "non_utf8.yaml"})
    EXPECT_NE(std::find(files.begin(), files.end(), required), files.end()) << required;
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadChip, ::testing::ValuesIn(bad_chip_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = fs::path(info.param).stem().string();
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c)))
                               c = '_';
                           return name;
                         });

// ---- fitted_chip_yaml ---------------------------------------------------------------------

chip_efficiency some_fit() {
  chip_efficiency e;
  e.mxu = 0.7321;
  e.vpu = 0.5;
  e.hbm = 0.912345678901234;
  e.dma_latency_us = 0.25;
  e.step_overhead_us = 0.4;
  e.kernel_launch_us = 3;
  e.xla_mxu = 0.75;
  e.xla_hbm = 1;
  e.xla_fusion_us = 0;
  e.f32_matmul_passes = 6;
  e.slot_overlap = 0.5;
  return e;
}

void expect_same(const chip_efficiency& a, const chip_efficiency& b) {
  EXPECT_EQ(a.mxu, b.mxu);
  EXPECT_EQ(a.vpu, b.vpu);
  EXPECT_EQ(a.hbm, b.hbm);
  EXPECT_EQ(a.dma_latency_us, b.dma_latency_us);
  EXPECT_EQ(a.step_overhead_us, b.step_overhead_us);
  EXPECT_EQ(a.kernel_launch_us, b.kernel_launch_us);
  EXPECT_EQ(a.xla_mxu, b.xla_mxu);
  EXPECT_EQ(a.xla_hbm, b.xla_hbm);
  EXPECT_EQ(a.xla_fusion_us, b.xla_fusion_us);
  EXPECT_EQ(a.f32_matmul_passes, b.f32_matmul_passes);
  EXPECT_EQ(a.slot_overlap, b.slot_overlap);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

TEST(FittedChipYaml, ReplacesOnlyTheEfficiencyValuesAndKeepsComments) {
  const std::string original = read_all(fs::path(shipped_dir) / "v6e.yaml");
  std::string error;
  std::string fitted = fitted_chip_yaml(original, some_fit(), "fitted on 12 kernels", error);
  ASSERT_FALSE(fitted.empty()) << error;
  EXPECT_TRUE(error.empty());

  // Line by line: one line more (the note); outside the efficiency block nothing changed,
  // and every comment is still there.
  auto before = lines_of(original), after = lines_of(fitted);
  ASSERT_EQ(after.size(), before.size() + 1);
  size_t efficiency_line = 0;
  while (efficiency_line < before.size() && before[efficiency_line].rfind("efficiency:", 0) != 0)
    ++efficiency_line;
  ASSERT_LT(efficiency_line, before.size());
  for (size_t i = 0; i < efficiency_line; ++i)
    EXPECT_EQ(after[i], before[i]);
  EXPECT_EQ(after[efficiency_line], "# calibrate: fitted on 12 kernels");
  EXPECT_EQ(after[efficiency_line + 1], before[efficiency_line]);  // its comment too
  for (size_t i = efficiency_line + 1; i < before.size(); ++i) {
    auto key = before[i].substr(0, before[i].find(':') + 1);
    EXPECT_EQ(after[i + 1].substr(0, key.size()), key);
  }
  EXPECT_NE(fitted.find("  mxu: 0.7321\n"), std::string::npos);
  EXPECT_NE(fitted.find("  f32_matmul_passes: 6.0\n"), std::string::npos);
  EXPECT_NE(fitted.find("  xla_hbm: 1.0\n"), std::string::npos);

  // Round trip: loading the result gives the fitted constants and the same chip otherwise.
  temp_spec_dir dir;
  std::string path = dir.write("v6e.yaml", fitted);
  chip reloaded, shipped;
  spec_error load_error;
  ASSERT_TRUE(load_chip_file(path, reloaded, load_error)) << load_error.what();
  ASSERT_TRUE(load_chip_file(shipped_dir + "/v6e.yaml", shipped, load_error));
  expect_same(reloaded.efficiency, some_fit());
  EXPECT_EQ(reloaded.bf16_flops, shipped.bf16_flops);
  EXPECT_EQ(reloaded.vmem_bytes, shipped.vmem_bytes);
  EXPECT_EQ(reloaded.ici_links, shipped.ici_links);
}

TEST(FittedChipYaml, ASecondFitReplacesTheEarlierNote) {
  const std::string original = read_all(fs::path(shipped_dir) / "v5p.yaml");
  std::string error;
  std::string once = fitted_chip_yaml(original, some_fit(), "first\nsecond line", error);
  ASSERT_FALSE(once.empty()) << error;
  EXPECT_NE(once.find("# calibrate: first\n# calibrate: second line\nefficiency:"),
            std::string::npos);
  chip_efficiency again = some_fit();
  again.mxu = 0.88;
  std::string twice = fitted_chip_yaml(once, again, "third", error);
  ASSERT_FALSE(twice.empty()) << error;
  EXPECT_EQ(twice.find("first"), std::string::npos);
  EXPECT_NE(twice.find("# calibrate: third\nefficiency:"), std::string::npos);
  EXPECT_EQ(lines_of(twice).size(), lines_of(original).size() + 1);
  EXPECT_NE(twice.find("  mxu: 0.88\n"), std::string::npos);
}

TEST(FittedChipYaml, FlowStyleBlockAndInlineComments) {
  std::string original = read_all(fs::path(shipped_dir) / "v5e.yaml");
  auto block = original.find("efficiency:");
  ASSERT_NE(block, std::string::npos);
  original = original.substr(0, block) +
             "efficiency: {mxu: 0.9, vpu: 0.6, hbm: 0.85,   # the shares\n"
             "  dma_latency_us: 0.5, step_overhead_us: 0.35, kernel_launch_us: 2.0,\n"
             "  xla_mxu: 0.8, xla_hbm: 0.8, xla_fusion_us: 1.5, f32_matmul_passes: 3.0,\n"
             "  slot_overlap: 0.75}\n";
  std::string error;
  std::string fitted = fitted_chip_yaml(original, some_fit(), "flow", error);
  ASSERT_FALSE(fitted.empty()) << error;
  EXPECT_NE(fitted.find("hbm: 0.912345678901234,   # the shares\n"), std::string::npos) << fitted;
  temp_spec_dir dir;
  chip c;
  spec_error load_error;
  ASSERT_TRUE(load_chip_file(dir.write("v5e.yaml", fitted), c, load_error)) << load_error.what();
  expect_same(c.efficiency, some_fit());
}

TEST(FittedChipYaml, RefusesBadConstantsAndBadFiles) {
  const std::string original = read_all(fs::path(shipped_dir) / "v6e.yaml");
  std::string error;
  chip_efficiency bad = some_fit();
  bad.mxu = 1.5;
  EXPECT_EQ(fitted_chip_yaml(original, bad, "x", error), "");
  EXPECT_NE(error.find("efficiency.mxu"), std::string::npos) << error;

  bad = some_fit();
  bad.dma_latency_us = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(fitted_chip_yaml(original, bad, "x", error), "");
  EXPECT_NE(error.find("efficiency.dma_latency_us"), std::string::npos) << error;

  EXPECT_EQ(fitted_chip_yaml(original, some_fit(), "bell \a", error), "");
  EXPECT_NE(error.find("note"), std::string::npos) << error;

  std::string broken = replace_once(original, "  xla_hbm: 0.8\n", "");
  EXPECT_EQ(fitted_chip_yaml(broken, some_fit(), "x", error), "");
  EXPECT_NE(error.find("efficiency.xla_hbm"), std::string::npos) << error;

  EXPECT_EQ(fitted_chip_yaml("name: v6e\n,\n", some_fit(), "x", error), "");
  EXPECT_FALSE(error.empty());
}

}  // namespace
}  // namespace maxkernel::config::test
