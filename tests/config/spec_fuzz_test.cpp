// Mutated bytes of a good spec: the loader must never crash, and must either succeed or
// return an error with a message.
#include "temp_spec_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

namespace maxkernel::config::test {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SpecFuzz, MutationsNeverCrash) {
  const std::string seed_spec = read_all(MAXKERNEL_SOURCE_DIR "/examples/matmul/spec.yaml");
  ASSERT_FALSE(seed_spec.empty());
  const std::string specials = ":-[]{}&*!|>'\"%@`#,?\n\t \\0123456789.e";
  std::mt19937 rng(20240611);  // deterministic
  temp_spec_dir dir;
  int loaded = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    std::string s = seed_spec;
    std::uniform_int_distribution<size_t> pos(0, s.size() - 1);
    switch (i % 5) {
      case 0:  // truncation
        s.resize(pos(rng));
        break;
      case 1:  // random byte flips, any value
        for (int k = 0; k < 1 + i % 4; ++k)
          s[pos(rng)] = static_cast<char>(rng() & 0xFF);
        break;
      case 2:  // YAML-significant characters
        for (int k = 0; k < 1 + i % 3; ++k)
          s[pos(rng)] = specials[rng() % specials.size()];
        break;
      case 3: {  // delete or duplicate a span
        size_t a = pos(rng), len = rng() % 40;
        std::string span = s.substr(a, len);
        if (rng() % 2)
          s.erase(a, len);
        else
          s.insert(a, span);
        break;
      }
      case 4:  // insert a special character
        s.insert(pos(rng), 1, specials[rng() % specials.size()]);
        break;
    }
    auto path = dir.write("spec.yaml", s);  // one file, rewritten: no per-variant fs churn
    load_result r;
    load(path, r);
    if (r.ok) {
      ++loaded;
      EXPECT_GT(r.spec.asReader().getConfigurations().size(), 0u);
    } else {
      ++refused;
      EXPECT_FALSE(r.error.message.empty()) << "variant " << i;
      EXPECT_EQ(r.error.what().find('\n'), std::string::npos) << r.error.what();
    }
  }
  EXPECT_GT(refused, 100);  // the mutations do break things
  EXPECT_GT(loaded, 0);     // and some (inside comments, descriptions) do not
}

}  // namespace
}  // namespace maxkernel::config::test
