// normalize_source: only edits that cannot change what Python runs.
#include "search/evaluation_key.hpp"

#include <gtest/gtest.h>

namespace maxkernel::search {
namespace {

TEST(NormalizeSource, CrlfAndLoneCrBecomeLf) {
  EXPECT_EQ(normalize_source("a = 1\r\nb = 2\r\n"), "a = 1\nb = 2\n");
  EXPECT_EQ(normalize_source("a = 1\rb = 2\r"), "a = 1\nb = 2\n");
  EXPECT_EQ(normalize_source("a = 1\r\n\r\nb = 2"), "a = 1\n\nb = 2\n");
}

TEST(NormalizeSource, TrailingSpacesAndTabsRemoved) {
  EXPECT_EQ(normalize_source("a = 1   \nb = 2\t \n"), "a = 1\nb = 2\n");
  EXPECT_EQ(normalize_source("x = 1  # note  \t\n"), "x = 1  # note\n");
}

TEST(NormalizeSource, TrailingBlankLinesRemovedAndOneFinalNewline) {
  EXPECT_EQ(normalize_source("a = 1\n\n\n   \n\t\n"), "a = 1\n");
  EXPECT_EQ(normalize_source("a = 1"), "a = 1\n");
  EXPECT_EQ(normalize_source(""), "");
  EXPECT_EQ(normalize_source("\n  \r\n\n"), "");
}

TEST(NormalizeSource, IndentationPreserved) {
  std::string src = "def f(x):\n    if x:\n\treturn 1\n    return 2\n";
  EXPECT_EQ(normalize_source(src), src);
  EXPECT_NE(normalize_source("def f():\n  return 1\n"), normalize_source("def f():\n    return 1\n"));
}

TEST(NormalizeSource, InnerBlankLinesPreservedSoLineNumbersStay) {
  EXPECT_EQ(normalize_source("a = 1\n\n\nb = 2\n"), "a = 1\n\n\nb = 2\n");
  // A whitespace-only inner line keeps its place, emptied.
  EXPECT_EQ(normalize_source("a = 1\n    \nb = 2\n"), "a = 1\n\nb = 2\n");
}

TEST(NormalizeSource, LeadingBlankLinesPreserved) {
  EXPECT_EQ(normalize_source("\n\na = 1\n"), "\n\na = 1\n");
}

TEST(NormalizeSource, TrailingSpacesInsideTripleQuotedStringsKept) {
  // They are part of the string's value.
  std::string src = "s = \"\"\"line one   \nline two\t\n\"\"\"   \nt = 1  \n";
  EXPECT_EQ(normalize_source(src), "s = \"\"\"line one   \nline two\t\n\"\"\"\nt = 1\n");
  std::string single = "s = '''a  \n'''\n";
  EXPECT_EQ(normalize_source(single), single);
  // Once the string has closed, stripping resumes; quotes in comments open nothing.
  EXPECT_EQ(normalize_source("# don't \"\"\" \nx = 1  \n"), "# don't \"\"\"\nx = 1\n");
  EXPECT_EQ(normalize_source("x = 'a\"\"\"b'  \ny = 2  \n"), "x = 'a\"\"\"b'\ny = 2\n");
  EXPECT_EQ(normalize_source("x = ''  \ny = 2  \n"), "x = ''\ny = 2\n");
  // An escaped quote does not close the string.
  std::string escaped = "s = \"\"\"a\\\"\"\"  \nb  \n\"\"\"\n";
  EXPECT_EQ(normalize_source(escaped), escaped);
}

TEST(NormalizeSource, SpacesAfterBackslashKept) {
  // "x = 1 + \\  " is a syntax error; stripping would make it a line continuation.
  std::string src = "x = 1 + \\  \n    2\n";
  EXPECT_EQ(normalize_source(src), src);
  EXPECT_EQ(normalize_source("x = 1 + \\\n    2  \n"), "x = 1 + \\\n    2\n");
}

TEST(NormalizeSource, IsIdempotent) {
  for (std::string src : {"a = 1  \r\n\r\n", "s = '''x  \n'''  \n\n", "y = \\ \n 1\n", ""}) {
    std::string once = normalize_source(src);
    EXPECT_EQ(normalize_source(once), once) << src;
  }
}

}  // namespace
}  // namespace maxkernel::search
