// Every file in bad_specs/ is one malformed spec whose first line reads `# expect: FIELD`:
// loading it must fail, naming that field and a line, without crashing.
#include "temp_spec_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace maxkernel::config::test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> bad_spec_files() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(MAXKERNEL_BAD_SPECS_DIR))
    if (entry.path().extension() == ".yaml")
      files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::string expected_field(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string first;
  std::getline(in, first);
  const std::string prefix = "# expect: ";
  return first.rfind(prefix, 0) == 0 ? first.substr(prefix.size()) : std::string{};
}

class BadSpec : public ::testing::TestWithParam<std::string> {};

TEST_P(BadSpec, FailsNamingTheFieldAndLine) {
  fs::path file = fs::path(MAXKERNEL_BAD_SPECS_DIR) / GetParam();
  std::string field = expected_field(file);
  ASSERT_FALSE(field.empty()) << file << " lacks its `# expect: FIELD` first line";
  load_result r;
  load(file.string(), r);
  ASSERT_FALSE(r.ok) << file << " loaded";
  EXPECT_EQ(r.error.field, field) << r.error.what();
  EXPECT_GT(r.error.line, 0) << r.error.what();
  EXPECT_GT(r.error.column, 0) << r.error.what();
  EXPECT_EQ(r.error.file, file.string());
  EXPECT_FALSE(r.error.message.empty());
  // The rendered error carries the position and the field.
  EXPECT_NE(r.error.what().find(":" + std::to_string(r.error.line) + ":"), std::string::npos);
  EXPECT_NE(r.error.what().find(field), std::string::npos);
  EXPECT_EQ(r.error.too_large, GetParam().rfind("too_large", 0) == 0) << r.error.what();
}

TEST(BadSpecCorpus, HasAtLeast25Cases) { EXPECT_GE(bad_spec_files().size(), 25u); }

INSTANTIATE_TEST_SUITE_P(Corpus, BadSpec, ::testing::ValuesIn(bad_spec_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = fs::path(info.param).stem().string();
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c)))
                               c = '_';
                           return name;
                         });

}  // namespace
}  // namespace maxkernel::config::test
