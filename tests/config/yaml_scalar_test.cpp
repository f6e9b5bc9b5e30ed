// The YAML 1.2 core-schema resolution that decides whether `1e-5` is a number and `"8"` is not.
#include "config/nearest_name.hpp"
#include "config/python_source.hpp"
#include "config/shown_value.hpp"
#include "config/utf8_check.hpp"
#include "config/yaml_scalar.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace maxkernel::config {
namespace {

using kind = yaml_scalar::kind;

TEST(YamlScalar, CoreSchema) {
  EXPECT_EQ(resolve_scalar("1024", true).type, kind::integer);
  EXPECT_EQ(resolve_scalar("1024", true).integer_value, 1024);
  EXPECT_EQ(resolve_scalar("-9223372036854775808", true).integer_value, INT64_MIN);
  EXPECT_TRUE(resolve_scalar("9223372036854775808", true).out_of_range);
  EXPECT_EQ(resolve_scalar("0x10", true).integer_value, 16);
  EXPECT_EQ(resolve_scalar("0o17", true).integer_value, 15);
  EXPECT_EQ(resolve_scalar("1e-2", true).type, kind::floating);
  EXPECT_DOUBLE_EQ(resolve_scalar("1e-2", true).float_value, 0.01);
  EXPECT_DOUBLE_EQ(resolve_scalar("+.5", true).float_value, 0.5);
  EXPECT_DOUBLE_EQ(resolve_scalar("-2.", true).float_value, -2.0);
  EXPECT_TRUE(std::isinf(resolve_scalar("1e999", true).float_value));
  EXPECT_EQ(resolve_scalar("1e-999", true).float_value, 0.0);
  EXPECT_TRUE(std::isinf(resolve_scalar("-.inf", true).float_value));
  EXPECT_TRUE(std::isnan(resolve_scalar(".nan", true).float_value));
  EXPECT_EQ(resolve_scalar("true", true).type, kind::boolean);
  EXPECT_EQ(resolve_scalar("~", true).type, kind::null_value);
  for (const char* s : {"1e", "e5", ".", "1.2.3", "0x", "yes", "M", "1_000", "--1"})
    EXPECT_EQ(resolve_scalar(s, true).type, kind::string) << s;
  EXPECT_EQ(resolve_scalar("8", false).type, kind::string);  // quoted
}

TEST(Utf8Check, PositionsAndRefusals) {
  EXPECT_TRUE(find_invalid_text("a: b\n\xef\xbb\xbf" "c").has_value());  // a BOM mid-file
  EXPECT_FALSE(find_invalid_text("\xef\xbb\xbf" "a: caf\xc3\xa9\n\tb").has_value());
  auto p = find_invalid_text("a: 1\nb: \xc3\xa9\xff\n");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->line, 2);
  EXPECT_EQ(p->column, 5);
  EXPECT_TRUE(find_invalid_text("\xc0\xaf").has_value());          // overlong '/'
  EXPECT_TRUE(find_invalid_text("\xed\xa0\x80").has_value());      // surrogate
  EXPECT_TRUE(find_invalid_text("\xf4\x90\x80\x80").has_value());  // > U+10FFFF
  EXPECT_TRUE(find_invalid_text("\xe2\x82").has_value());          // truncated
  EXPECT_TRUE(find_invalid_text(std::string("a\0b", 3)).has_value());
}

TEST(NearestName, SuggestsTyposOnly) {
  std::vector<std::string> keys{"name", "dtype", "shape", "generator"};
  EXPECT_EQ(nearest_name("dtyp", keys), "dtype");
  EXPECT_EQ(nearest_name("Shape", keys), "shape");
  EXPECT_EQ(nearest_name("genrator", keys), "generator");
  EXPECT_EQ(nearest_name("completely_different", keys), "");
}

TEST(ShownValue, OneShortLine) {
  EXPECT_EQ(shown_value("bfloat"), "bfloat");
  EXPECT_EQ(shown_value("a\nb\tc"), "a b c");
  auto long_value = shown_value(std::string(100, 'x') + "\n" + std::string(100, 'y'));
  EXPECT_EQ(long_value, std::string(37, 'x') + "...");
  // Never cut inside a UTF-8 character.
  auto accented = shown_value(std::string(36, 'a') + "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9");
  EXPECT_EQ(accented, std::string(36, 'a') + "\xc3\xa9...");
}

TEST(PythonSource, FindsModuleLevelDefs) {
  EXPECT_TRUE(defines_function("import x\n\ndef reference(a, b):\n  pass\n", "reference"));
  EXPECT_TRUE(defines_function("async  def reference (a):\n", "reference"));
  EXPECT_FALSE(defines_function("def reference_impl(a):\n", "reference"));
  EXPECT_FALSE(defines_function("class A:\n  def reference(self):\n", "reference"));
  EXPECT_FALSE(defines_function("# def reference(a):\n", "reference"));
  EXPECT_FALSE(defines_function("reference = lambda a: a\n", "reference"));
}

}  // namespace
}  // namespace maxkernel::config
