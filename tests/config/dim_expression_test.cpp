// Derived dims: `dims: {MAX_SEQS: 64, SEQ_BOUNDS: MAX_SEQS + 1}`. The expression grammar and
// its evaluation (Python's floor division, checked 64-bit arithmetic), and how the loader
// resolves, validates and records derived dims.
#include "temp_spec_dir.hpp"

#include "config/dim_expression.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace maxkernel::config::test {
namespace {

// The value of `text` with the given dims, or the error message (prefixed "error@OFFSET: ").
std::string eval(std::string_view text, const std::map<std::string, int64_t>& dims = {}) {
  dim_expression_error err;
  auto e = dim_expression::parse(text, err);
  if (!e)
    return "error@" + std::to_string(err.offset) + ": " + err.message;
  auto v = e->evaluate([&](const std::string& n) { return dims.at(n); }, err);
  if (!v)
    return "error@" + std::to_string(err.offset) + ": " + err.message;
  return std::to_string(*v);
}

TEST(DimExpression, PrecedenceAssociativityAndParentheses) {
  std::map<std::string, int64_t> d{{"M", 64}, {"D", 128}, {"_k2", 3}};
  EXPECT_EQ(eval("M + 1", d), "65");
  EXPECT_EQ(eval("D // 2", d), "64");
  EXPECT_EQ(eval("2 + 3 * 4"), "14");
  EXPECT_EQ(eval("(2 + 3) * 4"), "20");
  EXPECT_EQ(eval("10 - 4 - 3"), "3");        // left-associative
  EXPECT_EQ(eval("100 // 10 // 3"), "3");    // (100 // 10) // 3, not 100 // 3
  EXPECT_EQ(eval("M*D//_k2", d), "2730");     // (64 * 128) // 3
  EXPECT_EQ(eval("  ( ( M ) )\t", d), "64");
  EXPECT_EQ(eval("0"), "0");
}

TEST(DimExpression, FloorDivisionRoundsDownAsInPython) {
  EXPECT_EQ(eval("7 // 2"), "3");
  EXPECT_EQ(eval("(1 - 8) // 2"), "-4");  // C++ would truncate to -3
  EXPECT_EQ(eval("7 // (1 - 3)"), "-4");
  EXPECT_EQ(eval("(0 - 7) // (0 - 2)"), "3");
  EXPECT_EQ(eval("(1 - 7) // 3"), "-2");  // exact: no adjustment
  EXPECT_EQ(floor_divide(INT64_MIN, -1), std::nullopt);
  EXPECT_EQ(floor_divide(5, 0), std::nullopt);
}

TEST(DimExpression, NamesAreListedOnceInOrderOfUse) {
  dim_expression_error err;
  auto e = dim_expression::parse("B * (S + B) - PAGES // S", err);
  ASSERT_TRUE(e) << err.message;
  ASSERT_EQ(e->names().size(), 3u);
  EXPECT_EQ(e->names()[0].name, "B");
  EXPECT_EQ(e->names()[0].offset, 0u);
  EXPECT_EQ(e->names()[1].name, "S");
  EXPECT_EQ(e->names()[1].offset, 5u);
  EXPECT_EQ(e->names()[2].name, "PAGES");
  EXPECT_EQ(e->names()[2].offset, 14u);
}

TEST(DimExpression, RefusesWhatIsNotInTheGrammarWithItsOffset) {
  EXPECT_EQ(eval("M / 2"), "error@2: '/' is true division; write '//' for integer (floor) division");
  EXPECT_NE(eval("M ** 2").find("error@2: '**' (power)"), std::string::npos);
  EXPECT_NE(eval("M % 2").find("error@2: '%' is not supported"), std::string::npos);
  EXPECT_NE(eval("-M").find("error@0: a unary '-'"), std::string::npos);
  EXPECT_NE(eval("M + -1").find("error@4: a unary '-'"), std::string::npos);
  EXPECT_NE(eval("(M + 1").find("error@0: '(' is never closed"), std::string::npos);
  EXPECT_NE(eval("M + 1)").find("error@5: unbalanced ')'"), std::string::npos);
  EXPECT_NE(eval("M +").find("error@3: the expression ends"), std::string::npos);
  EXPECT_NE(eval("M N").find("error@2: expected an operator (+ - * //), got 'N'"),
            std::string::npos);
  EXPECT_NE(eval("2M").find("error@0: '2M' is neither"), std::string::npos);
  EXPECT_NE(eval("1.5 * M").find("error@1: sizes are integers"), std::string::npos);
  EXPECT_NE(eval("08").find("error@0: '08': integers do not start with 0"), std::string::npos);
  EXPECT_NE(eval("f(M)").find("error@1"), std::string::npos);
  EXPECT_NE(eval("M[0]").find("error@1"), std::string::npos);
  EXPECT_NE(eval("").find("error@0: the expression is empty"), std::string::npos);
  EXPECT_NE(eval("   ").find("error@3: the expression is empty"), std::string::npos);
  EXPECT_NE(eval("99999999999999999999").find("does not fit in 64 bits"), std::string::npos);
  EXPECT_NE(eval(std::string(70, '(') + "1" + std::string(70, ')')).find("nested deeper than 64"),
            std::string::npos);
  std::string longest(dim_expression::max_length + 1, '1');
  EXPECT_NE(eval(longest).find("the limit is 1000"), std::string::npos);
}

TEST(DimExpression, DivisionByZeroAndOverflowAreErrorsAtTheOperator) {
  EXPECT_EQ(eval("D // (K - 4)", {{"D", 128}, {"K", 4}}), "error@2: division by zero (128 // 0)");
  EXPECT_NE(eval("4611686018427387904 * 2").find("error@20: 4611686018427387904 * 2 does not fit"),
            std::string::npos);
  EXPECT_NE(eval("0 - 9223372036854775807 - 2").find("does not fit in 64 bits"),
            std::string::npos);
  EXPECT_NE(eval("9223372036854775807 + 1").find("does not fit in 64 bits"), std::string::npos);
}

// ------------------------------------------------------------------------------ the loader

std::string spec_with_dims(const std::string& dims, const std::string& shape = "[MAX_SEQS]") {
  return "name: t\ndims: " + dims + "\ninputs:\n  - {name: a, shape: " + shape +
         ", dtype: float32}\nreference: |\n  def reference(a):\n    return a\n";
}

TEST(DerivedDims, EvaluatedRecordedAndUsableInShapes) {
  temp_spec_dir dir;
  auto path = dir.write(
      "s.yaml", spec_with_dims("{SEQ_BOUNDS: MAX_SEQS + 1, MAX_SEQS: 64, D: 128, HALF: D // 2,\n"
                               "       QUOTED: \"(HALF - 1) * 2\", CONST: 3 * 4}",
                               "[SEQ_BOUNDS, HALF, QUOTED]"));
  load_result r;
  load(path, r);
  ASSERT_TRUE(r.ok) << r.error.what();
  auto dims = r.spec.asReader().getDims();
  ASSERT_EQ(dims.size(), 6u);  // file order, a forward reference resolved
  std::vector<std::tuple<std::string, int64_t, std::string>> got;
  for (auto d : dims)
    got.emplace_back(d.getName(), d.getSize(), d.getExpression());
  std::vector<std::tuple<std::string, int64_t, std::string>> want{
      {"SEQ_BOUNDS", 65, "MAX_SEQS + 1"}, {"MAX_SEQS", 64, ""},
      {"D", 128, ""},                     {"HALF", 64, "D // 2"},
      {"QUOTED", 126, "(HALF - 1) * 2"},  {"CONST", 12, "3 * 4"}};
  EXPECT_EQ(got, want);
  auto a = r.spec.asReader().getConfigurations()[0].getInputs()[0];
  ASSERT_EQ(a.getType().getShape().size(), 3u);
  EXPECT_EQ(a.getType().getShape()[0], 65);
  EXPECT_EQ(a.getType().getShape()[1], 64);
  EXPECT_EQ(a.getType().getShape()[2], 126);
  EXPECT_EQ(std::string(a.getDimNames()[0]), "SEQ_BOUNDS");
}

struct bad_dims {
  const char* dims;
  const char* field;
  int column;  // where the error points, 1-based, in the `dims: ...` line (line 2)
  const char* message_part;
};

class DerivedDimErrors : public ::testing::TestWithParam<bad_dims> {};

TEST_P(DerivedDimErrors, NameTheFieldTheColumnAndTheCause) {
  const auto& c = GetParam();
  temp_spec_dir dir;
  auto path = dir.write("s.yaml", spec_with_dims(c.dims));
  load_result r;
  load(path, r);
  ASSERT_FALSE(r.ok) << c.dims;
  EXPECT_EQ(r.error.field, c.field) << r.error.what();
  EXPECT_EQ(r.error.line, 2) << r.error.what();
  EXPECT_EQ(r.error.column, c.column) << r.error.what();
  EXPECT_NE(r.error.message.find(c.message_part), std::string::npos) << r.error.what();
  EXPECT_EQ(r.error.file, path);
}

// Columns count from the start of the `dims: {` line; an expression error points into it.
INSTANTIATE_TEST_SUITE_P(
    Loader, DerivedDimErrors,
    ::testing::Values(
        bad_dims{"{MAX_SEQS: 64, SEQ_BOUNDS: MAX_SEQ + 1}", "dims.SEQ_BOUNDS", 34,
                 "unknown dimension 'MAX_SEQ' (did you mean 'MAX_SEQS'?)"},
        bad_dims{"{MAX_SEQS: 64, X: Y + 1}", "dims.X", 25, "declared: MAX_SEQS"},
        bad_dims{"{MAX_SEQS: 2 * MAX_SEQS}", "dims.MAX_SEQS", 22, "in terms of itself"},
        bad_dims{"{MAX_SEQS: B + 1, B: C * 2, C: MAX_SEQS // 2}", "dims.C", 38,
                 "cycle: MAX_SEQS -> B -> C -> MAX_SEQS"},
        bad_dims{"{MAX_SEQS: 8, K: 8, X: MAX_SEQS // (K - 8)}", "dims.X", 39,
                 "division by zero (8 // 0) with MAX_SEQS = 8, K = 8"},
        bad_dims{"{MAX_SEQS: 64, X: MAX_SEQS - 64}", "dims.X", 25,
                 "'MAX_SEQS - 64' is 0 with MAX_SEQS = 64; sizes must be positive"},
        bad_dims{"{MAX_SEQS: 64, X: MAX_SEQS / 2}", "dims.X", 34, "write '//'"},
        bad_dims{"{MAX_SEQS: 64, X: \"MAX_SEQS +\"}", "dims.X", 36, "the expression ends"},
        bad_dims{"{MAX_SEQS: 64, X: 1.5}", "dims.X", 25, "expected a positive integer or an "
                                                       "integer expression"},
        bad_dims{"{MAX_SEQS: 64, X: true}", "dims.X", 25, "got a boolean 'true'"},
        bad_dims{"{MAX_SEQS: 4611686018427387904, X: MAX_SEQS * 2}", "dims.X", 51,
                 "4611686018427387904 * 2 does not fit in 64 bits"}));

// A chain D0 (literal) <- D1 <- ... <- Dn, declared forwards or backwards.
std::string chain(int n, bool backwards) {
  std::vector<std::string> items{"D0: 1"};
  for (int i = 1; i <= n; ++i)
    items.push_back("D" + std::to_string(i) + ": D" + std::to_string(i - 1) + " + 1");
  items.push_back("MAX_SEQS: D" + std::to_string(n));
  if (backwards)
    std::reverse(items.begin(), items.end());
  std::string dims = "{";
  for (size_t i = 0; i < items.size(); ++i)
    dims += (i ? ", " : "") + items[i];
  return dims + "}";
}

TEST(DerivedDims, ChainsDeeperThan64AreRefusedWhateverTheOrder) {
  temp_spec_dir dir;
  for (bool backwards : {false, true}) {
    load_result r;
    load(dir.write("s.yaml", spec_with_dims(chain(70, backwards))), r);
    ASSERT_FALSE(r.ok) << backwards;
    EXPECT_NE(r.error.message.find("nest more than 64 deep"), std::string::npos)
        << r.error.what();
    // 63 deep (MAX_SEQS is the 64th level) is fine, and evaluated through the chain.
    load_result ok;
    load(dir.write("s.yaml", spec_with_dims(chain(63, backwards))), ok);
    ASSERT_TRUE(ok.ok) << ok.error.what();
    EXPECT_EQ(ok.spec.asReader().getConfigurations()[0].getInputs()[0].getType().getShape()[0],
              64);
  }
}

TEST(DerivedDims, TheBenchmarkRaggedPagedAttentionSpecDerivesSeqBounds) {
  load_result r;
  load(MAXKERNEL_SOURCE_DIR "/bench/specs/operators/ragged_paged_attention.yaml", r);
  ASSERT_TRUE(r.ok) << r.error.what();
  bool found = false;
  for (auto d : r.spec.asReader().getDims())
    if (std::string(d.getName()) == "SEQ_BOUNDS") {
      found = true;
      EXPECT_EQ(std::string(d.getExpression()), "MAX_SEQS + 1");
      EXPECT_EQ(d.getSize(), 65);
    }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace maxkernel::config::test
