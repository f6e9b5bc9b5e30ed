// Cases that need a real filesystem layout: files a spec names must stay inside its
// directory, and the spec itself must be a small regular text file.
#include "temp_spec_dir.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>

namespace maxkernel::config::test {
namespace {

namespace fs = std::filesystem;

const char* inputs = "name: t\ninputs:\n  - {name: a, shape: [4], dtype: float32}\n";
const char* ref_source = "def reference(a):\n    return a\n";

TEST(SpecPaths, SymlinkLeadingOutIsRefused) {
  temp_spec_dir outside;
  temp_spec_dir dir;
  auto target = outside.write("ref.py", ref_source);
  fs::create_symlink(target, dir.path() / "ref.py");
  auto path = dir.write("s.yaml", std::string(inputs) + "reference_file: ref.py\n");
  load_result r;
  load(path, r);
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.field, "reference_file");
  EXPECT_EQ(r.error.line, 4);
  EXPECT_NE(r.error.message.find("symlink"), std::string::npos) << r.error.what();
}

TEST(SpecPaths, SymlinkedDirectoryOutIsRefusedForBaseline) {
  temp_spec_dir outside;
  temp_spec_dir dir;
  outside.write("k/kernel.py", "def workload(a):\n    return a\n");
  fs::create_directory_symlink(outside.path() / "k", dir.path() / "k");
  auto path = dir.write("s.yaml", std::string(inputs) + "reference: |\n  " +
                                      "def reference(a):\n    return a\nbaseline: k/kernel.py\n");
  load_result r;
  load(path, r);
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.field, "baseline");
}

TEST(SpecPaths, SymlinkInsideAndAbsolutePathInsideAreFine) {
  temp_spec_dir dir;
  auto real = dir.write("lib/ref_impl.py", ref_source);
  fs::create_symlink(real, dir.path() / "ref.py");
  auto path = dir.write("s.yaml", std::string(inputs) + "reference_file: ref.py\nbaseline: " +
                                      real + "\n");
  load_result r;
  load(path, r);
  ASSERT_TRUE(r.ok) << r.error.what();
  EXPECT_EQ(std::string(r.spec.asReader().getBaselinePath()), real);
  EXPECT_EQ(std::string(r.spec.asReader().getReference()), ref_source);
}

TEST(SpecPaths, SpecThatIsNotARegularFile) {
  temp_spec_dir dir;
  fs::create_directory(dir.path() / "d.yaml");
  ASSERT_EQ(mkfifo((dir.path() / "f.yaml").c_str(), 0600), 0);
  for (const char* name : {"d.yaml", "f.yaml", "missing.yaml"}) {
    load_result r;
    load((dir.path() / name).string(), r);  // a FIFO must not block
    ASSERT_FALSE(r.ok) << name;
    EXPECT_EQ(r.error.field, "(document)");
    EXPECT_FALSE(r.error.message.empty());
  }
}

TEST(SpecPaths, SpecLargerThanOneMebibyte) {
  temp_spec_dir dir;
  std::string big = std::string(inputs) + "reference: |\n  def reference(a):\n    return a\n";
  big += "description: \"" + std::string(1 << 20, 'x') + "\"\n";
  auto path = dir.write("big.yaml", big);
  load_result r;
  load(path, r);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.message.find("1 MiB"), std::string::npos) << r.error.what();
}

TEST(SpecPaths, DeepNestingIsRefusedNotACrash) {
  temp_spec_dir dir;
  std::string deep = std::string(inputs) + "description: " + std::string(100000, '[') +
                     std::string(100000, ']') + "\n";
  auto path = dir.write("deep.yaml", deep);
  load_result r;
  load(path, r);
  ASSERT_FALSE(r.ok);
  EXPECT_GT(r.error.line, 0);
  // Moderately deep (parsable) nesting trips our own depth limit instead.
  auto path2 = dir.write("deep2.yaml", std::string(inputs) + "description: " +
                                          std::string(200, '[') + std::string(200, ']') + "\n");
  load_result r2;
  load(path2, r2);
  ASSERT_FALSE(r2.ok);
  EXPECT_EQ(r2.error.field, "description") << r2.error.what();
}

TEST(SpecPaths, ReferenceFileThatIsNotUtf8) {
  temp_spec_dir dir;
  dir.write("ref.py", "# caf\xe9\ndef reference(a):\n    return a\n");
  auto path = dir.write("s.yaml", std::string(inputs) + "reference_file: ref.py\n");
  load_result r;
  load(path, r);
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.error.field, "reference_file");
  EXPECT_NE(r.error.message.find("UTF-8"), std::string::npos) << r.error.what();
}

}  // namespace
}  // namespace maxkernel::config::test
