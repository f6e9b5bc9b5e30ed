// The evaluator revision in every evaluation key: the worker package's digest follows its
// Python files (content, names, additions) and nothing else, wherever the tree is; on the
// model backend the chip file counts too; the key of a request changes with it.
#include "tpu_nodes/evaluator_revision.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

using namespace maxkernel::tpu_nodes;
namespace fs = std::filesystem;

namespace {

struct temp_tree {
  fs::path root;
  temp_tree() {
    std::string pattern = (fs::temp_directory_path() / "evaluator-revision-XXXXXX").string();
    root = mkdtemp(pattern.data());
  }
  ~temp_tree() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel, std::ios::binary) << text;
  }
};

TEST(EvaluatorRevision, TheWorkerDigestFollowsItsPythonFilesOnly) {
  temp_tree a;
  a.write("pkg/tester.py", "ATOL = 1e-3\n");
  a.write("pkg/sub/lowering.py", "def lower(): pass\n");
  auto base = tree_digest(a.root.string(), ".py");
  EXPECT_EQ(base.size(), 64u);
  // Not Python, or compiled: no part of it.
  a.write("pkg/README.md", "notes\n");
  a.write("pkg/__pycache__/tester.cpython-311.py", "bytecode\n");
  EXPECT_EQ(tree_digest(a.root.string(), ".py"), base);
  // The same tree elsewhere: the same digest.
  temp_tree b;
  b.write("pkg/tester.py", "ATOL = 1e-3\n");
  b.write("pkg/sub/lowering.py", "def lower(): pass\n");
  EXPECT_EQ(tree_digest(b.root.string(), ".py"), base);
  // An edit, a new file, a rename: another digest each.
  b.write("pkg/tester.py", "ATOL = 1e-2\n");
  auto edited = tree_digest(b.root.string(), ".py");
  EXPECT_NE(edited, base);
  a.write("pkg/extra.py", "\n");
  auto added = tree_digest(a.root.string(), ".py");
  EXPECT_NE(added, base);
  EXPECT_NE(added, edited);
  fs::rename(a.root / "pkg/extra.py", a.root / "pkg/other.py");
  EXPECT_NE(tree_digest(a.root.string(), ".py"), added);
  EXPECT_EQ(tree_digest((a.root / "absent").string(), ".py"), "missing");
}

TEST(EvaluatorRevision, TheChipFileCountsOnTheModelBackendOnly) {
  temp_tree t;
  t.write("v6e.yaml", "name: v6e\n");
  auto chip = file_digest((t.root / "v6e.yaml").string());
  t.write("v6e.yaml", "name: v6e\n# calibrate: fitted\n");
  auto recalibrated = file_digest((t.root / "v6e.yaml").string());
  EXPECT_NE(chip, recalibrated);
  EXPECT_EQ(file_digest((t.root / "v9.yaml").string()), "missing");
  EXPECT_NE(evaluator_revision_of("w", "model", chip),
            evaluator_revision_of("w", "model", recalibrated));
  EXPECT_EQ(evaluator_revision_of("w", "jax-tpu", chip),
            evaluator_revision_of("w", "jax-tpu", recalibrated));
  EXPECT_NE(evaluator_revision_of("w", "model", chip), evaluator_revision_of("w", "jax-tpu", chip));
  EXPECT_NE(evaluator_revision_of("w", "model", chip), evaluator_revision_of("w2", "model", chip));
}

TEST(EvaluatorRevision, ThisProcesssRevisionIsStableAndPerChip) {
  auto v6e = evaluator_revision("model", "v6e");
  EXPECT_EQ(v6e.size(), 64u);
  EXPECT_EQ(evaluator_revision("model", "v6e"), v6e);
  EXPECT_NE(evaluator_revision("model", "v5e"), v6e);  // two chip files
  // Measured times do not depend on a chip file.
  EXPECT_EQ(evaluator_revision("jax-tpu", "v6e"), evaluator_revision("jax-tpu", "v5e"));
}

}  // namespace
