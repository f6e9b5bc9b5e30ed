// Finding a suite's tasks by the task-input contract: native specs, JAXBench and MaxKernel task
// directories (not searched further), in path order, filtered by a glob.
#include "cli/bench_suite.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using maxkernel::cli::find_suite_tasks;
using maxkernel::cli::spec_kind;
using maxkernel::cli::suite_task;

namespace {

class bench_suite : public ::testing::Test {
protected:
  void SetUp() override {
    root = fs::temp_directory_path() / ("bench_suite_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    touch("ops/b_gemm.yaml");
    touch("ops/a_norm.yml");
    touch("ops/baselines/gemm.py");          // a baseline file, not a task
    touch("jb/attention/baseline.py");       // JAXBench task directory
    touch("jb/attention/inner/other.yaml");  // inside a task directory: not a task
    touch("mk/moe/kernel_task.yaml");        // MaxKernel task directory
    touch(".hidden/x.yaml");
    touch("__pycache__/y.yaml");
    touch("README.md");
  }
  void TearDown() override { fs::remove_all(root); }
  void touch(const std::string& rel) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << "x\n";
  }
  fs::path root;
};

}  // namespace

TEST_F(bench_suite, finds_every_kind_in_path_order) {
  std::vector<suite_task> tasks;
  std::string error;
  ASSERT_TRUE(find_suite_tasks(root.string(), "", tasks, error)) << error;
  ASSERT_EQ(tasks.size(), 4u);
  EXPECT_EQ(tasks[0].relative, "jb/attention");
  EXPECT_EQ(tasks[0].kind, spec_kind::jaxbench);
  EXPECT_EQ(tasks[1].relative, "mk/moe");
  EXPECT_EQ(tasks[1].kind, spec_kind::maxkernel);
  EXPECT_EQ(tasks[2].relative, "ops/a_norm");
  EXPECT_EQ(tasks[2].name, "a_norm");
  EXPECT_EQ(tasks[3].relative, "ops/b_gemm");
  EXPECT_EQ(tasks[3].kind, spec_kind::native);
  EXPECT_EQ(fs::path(tasks[3].path), root / "ops/b_gemm.yaml");
}

TEST_F(bench_suite, a_glob_matches_names_or_relative_paths) {
  std::vector<suite_task> tasks;
  std::string error;
  ASSERT_TRUE(find_suite_tasks(root.string(), "ops/*", tasks, error)) << error;
  EXPECT_EQ(tasks.size(), 2u);
  tasks.clear();
  ASSERT_TRUE(find_suite_tasks(root.string(), "*gemm", tasks, error)) << error;
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].name, "b_gemm");
  tasks.clear();
  ASSERT_TRUE(find_suite_tasks(root.string(), "mk/*,*norm", tasks, error)) << error;
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].relative, "mk/moe");
  EXPECT_EQ(tasks[1].relative, "ops/a_norm");
  tasks.clear();
  EXPECT_FALSE(find_suite_tasks(root.string(), "nothing*", tasks, error));
  EXPECT_NE(error.find("no task matches --tasks nothing*"), std::string::npos) << error;
}

TEST_F(bench_suite, a_suite_can_be_one_task) {
  std::vector<suite_task> tasks;
  std::string error;
  ASSERT_TRUE(find_suite_tasks((root / "jb/attention").string(), "", tasks, error)) << error;
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].name, "attention");
  tasks.clear();
  ASSERT_TRUE(find_suite_tasks((root / "ops/b_gemm.yaml").string(), "", tasks, error)) << error;
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].kind, spec_kind::native);
}

TEST_F(bench_suite, missing_and_empty_suites_are_errors) {
  std::vector<suite_task> tasks;
  std::string error;
  EXPECT_FALSE(find_suite_tasks((root / "nope").string(), "", tasks, error));
  EXPECT_NE(error.find("no such file or directory"), std::string::npos) << error;
  fs::create_directories(root / "empty/sub");
  EXPECT_FALSE(find_suite_tasks((root / "empty").string(), "", tasks, error));
  EXPECT_NE(error.find("no tasks"), std::string::npos) << error;
  EXPECT_FALSE(find_suite_tasks((root / "README.md").string(), "", tasks, error));
  EXPECT_TRUE(tasks.empty());
}
