// config/spec_file: reading a user's text file within the size limit.
#include "config/spec_file.hpp"
#include "temp_spec_dir.hpp"

#include <gtest/gtest.h>

#include <string>

namespace maxkernel::config::test {
namespace {

TEST(SpecFile, ReadsTheWholeFile) {
  temp_spec_dir dir;
  std::string content = "name: x\n" + std::string(10000, '#') + "\n";
  spec_error err;
  auto text = read_text_file(dir.write("a.yaml", content), err);
  ASSERT_TRUE(text) << err.message;
  EXPECT_EQ(*text, content);
}

TEST(SpecFile, ReadsAnEmptyFile) {
  temp_spec_dir dir;
  spec_error err;
  auto text = read_text_file(dir.write("empty.yaml", ""), err);
  ASSERT_TRUE(text) << err.message;
  EXPECT_TRUE(text->empty());
}

TEST(SpecFile, TakesTheLimitAndRefusesOneByteMore) {
  temp_spec_dir dir;
  spec_error err;
  auto at_limit = read_text_file(dir.write("limit.py", std::string(max_spec_file_bytes, 'a')), err);
  ASSERT_TRUE(at_limit) << err.message;
  EXPECT_EQ(at_limit->size(), max_spec_file_bytes);
  spec_error over_err;
  EXPECT_FALSE(read_text_file(dir.write("over.py", std::string(max_spec_file_bytes + 1, 'a')),
                              over_err));
  EXPECT_NE(over_err.message.find("limit"), std::string::npos) << over_err.message;
}

// The text is sized by the file, not by the limit: a small spec does not carry (and did not
// zero) a buffer of the limit's size, which kept a resident megabyte per malloc arena in a
// long-running supervisor (docs/reliability.md, "What grew in the supervisor").
TEST(SpecFile, HoldsNoBufferOfTheLimitsSize) {
  temp_spec_dir dir;
  spec_error err;
  auto text = read_text_file(dir.write("small.yaml", "name: small\n"), err);
  ASSERT_TRUE(text) << err.message;
  EXPECT_LT(text->capacity(), max_spec_file_bytes / 2);
}

}  // namespace
}  // namespace maxkernel::config::test
