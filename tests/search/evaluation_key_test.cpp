// evaluation_key: equal parts give equal keys, any differing part a different key.
#include "search/evaluation_key.hpp"

#include "messages/content_hash.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace maxkernel::search {
namespace {

evaluation_key_parts base() {
  evaluation_key_parts p;
  p.source = "def workload(x):\n    return x\n";
  p.spec_hash = "0f0f";
  p.chip = "v5e";
  p.backend = "model";
  p.jax_version = "0.10.2";
  p.options = "seed=1";
  return p;
}

TEST(EvaluationKey, IsLowercaseHexSha256) {
  std::string key = evaluation_key(base());
  ASSERT_EQ(key.size(), 64u);
  EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(EvaluationKey, StableForEqualParts) {
  std::string source = "def workload(x):\n    return x\n";  // other storage, same content
  auto p = base();
  p.source = source;
  EXPECT_EQ(evaluation_key(base()), evaluation_key(p));
}

TEST(EvaluationKey, DiffersWhenAnyPartDiffers) {
  std::set<std::string> keys{evaluation_key(base())};
  auto vary = [&](auto change) {
    auto p = base();
    change(p);
    return keys.insert(evaluation_key(p)).second;
  };
  EXPECT_TRUE(vary([](auto& p) { p.source = "def workload(x):\n    return x + 1\n"; }));
  EXPECT_TRUE(vary([](auto& p) { p.spec_hash = "0f0e"; }));
  EXPECT_TRUE(vary([](auto& p) { p.chip = "v6e"; }));
  EXPECT_TRUE(vary([](auto& p) { p.backend = "jax-tpu"; }));
  EXPECT_TRUE(vary([](auto& p) { p.jax_version = "0.10.1"; }));
  EXPECT_TRUE(vary([](auto& p) { p.options = "seed=2"; }));
  EXPECT_TRUE(vary([](auto& p) { p.reference = true; }));
  EXPECT_TRUE(vary([](auto& p) { p.options = ""; }));
  EXPECT_TRUE(vary([](auto& p) { p.evaluator = "3f2a"; }));
}

TEST(EvaluationKey, PartsAreLengthPrefixed) {
  // Moving bytes across a part boundary must change the key.
  auto a = base(), b = base();
  a.spec_hash = "ab";
  a.chip = "c";
  b.spec_hash = "a";
  b.chip = "bc";
  EXPECT_NE(evaluation_key(a), evaluation_key(b));
  auto c = base(), d = base();
  c.jax_version = "";
  c.options = "x";
  d.jax_version = "x";
  d.options = "";
  EXPECT_NE(evaluation_key(c), evaluation_key(d));
}

TEST(EvaluationKey, NotAPlainHashOfTheConcatenation) {
  auto p = base();
  std::string concat = normalize_source(p.source) + std::string(p.spec_hash) +
                       std::string(p.chip) + std::string(p.backend) +
                       std::string(p.jax_version) + std::string(p.options);
  EXPECT_NE(evaluation_key(p), messages::sha256_hex(concat));
}

// The key's bytes are fixed (format v1): stores written by earlier builds must stay hits.
// The key is the sha256 of the length-prefixed parts in this order, however it is computed
// (in one go or from a kernel's shared prefix).
TEST(EvaluationKey, FormatV1IsTheHashOfTheLengthPrefixedParts) {
  auto framed = [](std::initializer_list<std::string_view> parts) {
    std::string out;
    for (auto part : parts)
      out += std::to_string(part.size()) + ":" + std::string(part);
    return out;
  };
  auto p = base();
  auto expected = messages::sha256_hex(framed({"maxkernel.evaluation_key.v1", "candidate",
                                               normalize_source(p.source), p.spec_hash, p.chip,
                                               p.backend, p.jax_version, p.options}));
  EXPECT_EQ(evaluation_key(p), expected);
  auto prefix = evaluation_key_prefix(false, normalize_source(p.source));
  EXPECT_EQ(evaluation_key(prefix, p), expected);
  EXPECT_EQ(evaluation_key(prefix, p), expected);  // a prefix is not used up by a key
  p.reference = true;
  EXPECT_EQ(evaluation_key(evaluation_key_prefix(true, ""), p),
            messages::sha256_hex(framed({"maxkernel.evaluation_key.v1", "reference", "",
                                         p.spec_hash, p.chip, p.backend, p.jax_version,
                                         p.options})));
  // An evaluator revision is one more part at the end.
  p.reference = false;
  p.evaluator = "3f2a";
  EXPECT_EQ(evaluation_key(prefix, p),
            messages::sha256_hex(framed({"maxkernel.evaluation_key.v1", "candidate",
                                         normalize_source(p.source), p.spec_hash, p.chip,
                                         p.backend, p.jax_version, p.options, p.evaluator})));
}

TEST(EvaluationKey, Sha256StreamEqualsTheOneShotHash) {
  messages::sha256_stream s;
  EXPECT_EQ(s.hex(), messages::sha256_hex(""));
  s.update("abc");
  auto copy = s;
  s.update(std::string(10000, 'x'));
  EXPECT_EQ(copy.hex(), messages::sha256_hex("abc"));
  EXPECT_EQ(s.hex(), messages::sha256_hex("abc" + std::string(10000, 'x')));
  EXPECT_EQ(copy.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(EvaluationKey, StableUnderNormalisableWhitespace) {
  auto p = base();
  std::string crlf = "def workload(x):   \r\n    return x\r\n\r\n\r\n";
  p.source = crlf;
  EXPECT_EQ(evaluation_key(p), evaluation_key(base()));
  std::string no_final_newline = "def workload(x):\n    return x";
  p.source = no_final_newline;
  EXPECT_EQ(evaluation_key(p), evaluation_key(base()));
}

TEST(EvaluationKey, IndentationAndInnerBlankLinesMatter) {
  auto p = base();
  std::string reindented = "def workload(x):\n  return x\n";
  p.source = reindented;
  EXPECT_NE(evaluation_key(p), evaluation_key(base()));
  std::string blank = "def workload(x):\n\n    return x\n";
  p.source = blank;
  EXPECT_NE(evaluation_key(p), evaluation_key(base()));
}

}  // namespace
}  // namespace maxkernel::search
