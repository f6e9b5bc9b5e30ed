#include "agents/tester.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

namespace maxkernel::agents {
namespace {

using limits = tester_limits;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool is_float(std::string_view dtype) {
  return dtype.substr(0, 5) == "float" || dtype == "bfloat16";
}

// An 8-bit exponent or wider: x1000 stays far from overflow (float16 tops out at 65504,
// float8 types lower still).
bool has_range(std::string_view dtype) {
  return dtype == "float32" || dtype == "float64" || dtype == "bfloat16";
}

// Machine epsilon of a float dtype (0 for other dtypes: compared exactly anyway).
double epsilon(std::string_view dtype) {
  if (dtype == "float32")
    return std::ldexp(1.0, -23);
  if (dtype == "bfloat16")
    return std::ldexp(1.0, -7);
  if (dtype == "float16")
    return std::ldexp(1.0, -10);
  if (dtype == "float64")
    return std::ldexp(1.0, -52);
  if (dtype.substr(0, 6) == "float8")
    return std::ldexp(1.0, dtype.find("e5m2") != std::string_view::npos ? -2 : -3);
  return 0;
}

double itemsize(std::string_view dtype) {
  if (dtype == "float64" || dtype == "int64" || dtype == "uint64" || dtype == "complex64")
    return 8;
  if (dtype == "bfloat16" || dtype == "float16" || dtype == "int16" || dtype == "uint16")
    return 2;
  if (dtype == "int8" || dtype == "uint8" || dtype == "bool" || dtype.substr(0, 6) == "float8" ||
      dtype == "int4" || dtype == "uint4")
    return 1;
  return 4;
}

double elements(schema::TensorType::Reader t) {
  double n = 1;
  for (auto d : t.getShape())
    n *= static_cast<double>(std::max<int64_t>(d, 0));
  return n;
}

struct tolerance {
  double atol;
  double rtol;
};

// The worker's rule (task.py Task.tolerance): the output's own entry, else the entry for
// every output (-1), else the default.
tolerance tolerance_of(schema::KernelSpec::Reader spec, int output) {
  std::optional<tolerance> general;
  for (auto t : spec.getTolerances()) {
    if (t.getOutput() == output)
      return {t.getAtol(), t.getRtol()};
    if (t.getOutput() == -1 && !general)
      general = tolerance{t.getAtol(), t.getRtol()};
  }
  return general.value_or(tolerance{limits::default_tolerance, limits::default_tolerance});
}

// What choose_tests needs to know about a spec.
struct spec_facts {
  bool float_inputs = false;             // some non-static, non-structural float array
  std::string narrow;                    // a float input dtype without range ("" when none)
  std::vector<std::string> free_dims;    // dims on float inputs' last two axes, free to change
  double max_bytes = 0;                  // largest configuration: inputs + outputs
  double flops = 0;                      // the reference's (configuration 0), 0 unknown
  bool relative = true;                  // every float output's rtol covers large_ulps ulps
  std::string tight;                     // the first output whose rtol does not
};

spec_facts facts_of(schema::TesterRequest::Reader request) {
  spec_facts f;
  auto spec = request.getSpec();
  std::set<std::string> derived;
  for (auto d : spec.getDims())
    if (d.getExpression().size() > 0)
      derived.insert(d.getName());
  bool named = spec.getDims().size() > 0;
  std::set<std::string> free;
  unsigned c = 0;
  for (auto config : spec.getConfigurations()) {
    double bytes = 0;
    for (auto input : config.getInputs()) {
      if (input.getIsStatic())
        continue;
      auto type = input.getType();
      std::string dtype = type.getDtype();
      bytes += elements(type) * itemsize(dtype);
      if (input.getStructural() || !is_float(dtype))
        continue;
      f.float_inputs = true;
      if (!has_range(dtype) && f.narrow.empty())
        f.narrow = dtype;
      auto shape = type.getShape();
      auto names = input.getDimNames();
      for (unsigned axis = shape.size() >= 2 ? shape.size() - 2 : shape.size(); axis < shape.size();
           ++axis) {
        if (shape[axis] <= 1)
          continue;
        if (named) {
          std::string name = axis < names.size() ? std::string(names[axis].cStr()) : "";
          if (!name.empty() && !derived.count(name))
            free.insert(name);
        } else {
          free.insert(std::to_string(shape[axis]));
        }
      }
    }
    // Output types: the spec's, else (configuration 0) the analysis's.
    auto outputs = config.getOutputs();
    std::vector<schema::TensorType::Reader> types;
    for (auto t : outputs)
      types.push_back(t);
    if (types.empty() && c == 0 && request.hasAnalysis())
      for (auto t : request.getAnalysis().getOutputs())
        types.push_back(t);
    for (unsigned k = 0; k < types.size(); ++k) {
      std::string dtype = types[k].getDtype();
      bytes += elements(types[k]) * itemsize(dtype);
      double eps = epsilon(dtype);
      auto tol = tolerance_of(spec, static_cast<int>(k));
      if (is_float(dtype) && tol.rtol < limits::large_ulps * eps && f.relative) {
        f.relative = false;
        f.tight = fmt::format("output {} ({}) has rtol {:g}, below {:g} ulps ({:g})", k, dtype,
                              tol.rtol, limits::large_ulps, limits::large_ulps * eps);
      }
    }
    f.max_bytes = std::max(f.max_bytes, bytes);
    ++c;
  }
  f.free_dims.assign(free.begin(), free.end());
  f.flops = request.hasAnalysis() && request.getAnalysis().getFlops() > 0
              ? request.getAnalysis().getFlops()
              : spec.getFlops();
  return f;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep = ", ") {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty())
      out += sep;
    out += p;
  }
  return out;
}

std::string human_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024)
    return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024)
    return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

class plan_writer {
public:
  plan_writer(schema::TesterRequest::Reader request) : request_(request) {}

  struct case_spec {
    std::string name;
    std::string why;
    unsigned seeds = 1;
    bool full = false;
    std::string value_mode;
    double value_scale = 0;
    std::string shape_mode;
  };

  void add(const case_spec& c) { cases_.push_back(c); }

  void write(schema::TestPlan::Builder out) {
    out.setSchemaVersion(schema::SCHEMA_VERSION);
    auto list = out.initCases(static_cast<unsigned>(cases_.size()));
    unsigned next = 0;
    // 0, 1, 2: the seeds of the node's own test (the worker's defaults); a case adds others.
    std::set<uint64_t> used = {0, 1, 2};
    for (unsigned i = 0; i < cases_.size(); ++i) {
      const auto& c = cases_[i];
      auto dst = list[i];
      dst.setName(c.name);
      auto options = dst.initOptions();
      auto seeds = options.initSeeds(c.seeds);
      std::vector<std::string> seed_text;
      for (unsigned s = 0; s < c.seeds; ++s) {
        uint64_t seed;
        do
          seed = case_seed(request_.getSeed(), next++);
        while (!used.insert(seed).second);
        seeds.set(s, seed);
        seed_text.push_back(std::to_string(seed));
      }
      options.setFull(c.full);
      if (request_.getChip().size() > 0)
        options.setChip(request_.getChip());
      if (!c.value_mode.empty())
        options.setValueMode(c.value_mode);
      options.setValueScale(c.value_scale);
      if (!c.shape_mode.empty())
        options.setShapeMode(c.shape_mode);
      dst.setWhy(fmt::format("{} (seed{} {})", c.why, c.seeds == 1 ? "" : "s",
                             join(seed_text)));
    }
  }

private:
  schema::TesterRequest::Reader request_;
  std::vector<case_spec> cases_;
};

// ---------------------------------------------------------------------------- judging

enum class outcome { passed, failed, skipped };

struct case_result {
  outcome o = outcome::failed;
  std::string reason;   // why it failed or was skipped
  double ratio = 0;     // worst error / allowed error over its TestCases
};

const char* phase_name(schema::Phase p) {
  switch (p) {
    case schema::Phase::LOAD: return "load";
    case schema::Phase::LOWER: return "lower";
    case schema::Phase::TEST: return "test";
    case schema::Phase::PROFILE: return "profile";
  }
  return "?";
}

std::string class_name(schema::ErrorClass e) {
  // The enumerant names of eval.capnp, as the worker and the store spell them.
  static const char* names[] = {
    "none", "loadError", "noWorkload", "traceError", "lowerBlockShape", "lowerUnsupported",
    "lowerVerification", "lowerError", "wrongOutput", "mismatch", "nonFinite", "runtimeError",
    "rewardHack", "timeout", "crash", "sandboxViolation", "resourceLimit", "badInput",
    "internal", "tooLarge", "vmemOom", "overloaded"};
  auto i = static_cast<unsigned>(e);
  return i < sizeof names / sizeof names[0] ? names[i] : std::to_string(i);
}

std::string shorten(std::string s, size_t n = 300) {
  if (s.size() > n)
    s = s.substr(0, n) + "...";
  return s;
}

// An upper bound on max over elements of |got - expected| / (atol + rtol |expected|) from
// a TestCase's maxima: any element e has err_e <= maxAbs and err_e / |b_e| <= maxRel, so
// its ratio is at most maxAbs / (atol + rtol maxAbs / maxRel) (exact when one element has
// both maxima).
double ratio_bound(double max_abs, double max_rel, tolerance tol) {
  if (!(max_abs > 0))
    return 0;
  double allowed = tol.atol;
  if (max_rel > 0)
    allowed += tol.rtol * max_abs / max_rel;
  if (!(allowed > 0))
    return std::numeric_limits<double>::infinity();
  return max_abs / allowed;
}

case_result judge_case(schema::KernelSpec::Reader spec, schema::EvalResult::Reader r) {
  case_result out;
  std::optional<schema::PhaseResult::Reader> test;
  for (auto p : r.getPhases()) {
    if (p.getPhase() == schema::Phase::TEST)
      test = p;
    if (p.getStatus() == schema::Status::FAILED && p.getPhase() != schema::Phase::PROFILE &&
        out.reason.empty())
      out.reason = fmt::format("{} {}: {}", phase_name(p.getPhase()), class_name(p.getErrorClass()),
                               shorten(p.getMessage()));
  }
  auto failure_class = test ? test->getErrorClass() : schema::ErrorClass::NONE;
  for (auto tc : r.getTest().getCases()) {
    double bound = ratio_bound(tc.getMaxAbsErr(), tc.getMaxRelErr(),
                               tolerance_of(spec, std::max(tc.getOutput(), -1)));
    double ratio;
    if (tc.getPassed())
      ratio = std::min(bound, 1.0);  // it passed: no element exceeds its allowance
    else if (failure_class == schema::ErrorClass::MISMATCH)
      ratio = std::max(bound, 1.0);
    else  // no numerical comparison: NaN/Inf, wrong shape, a crash
      ratio = std::numeric_limits<double>::infinity();
    out.ratio = std::max(out.ratio, ratio);
  }
  if (!out.reason.empty()) {
    out.o = outcome::failed;
    if (out.ratio == 0)
      out.ratio = std::numeric_limits<double>::infinity();
    return out;
  }
  if (!test) {
    out.reason = "the result has no test phase";
    out.ratio = std::numeric_limits<double>::infinity();
    return out;
  }
  if (test->getStatus() == schema::Status::SKIPPED) {
    if (test->getMessage().size() == 0) {
      out.reason = "the test was skipped without a reason";
      return out;
    }
    out.o = outcome::skipped;
    out.reason = shorten(test->getMessage());
    return out;
  }
  if (!r.getCorrect()) {
    out.reason = "the test phase passed but the result is not marked correct";
    return out;
  }
  out.o = outcome::passed;
  return out;
}

std::string ratio_text(double r) {
  return std::isinf(r) ? std::string("unbounded") : fmt::format("{:.3g}", r);
}

}  // namespace

uint64_t case_seed(uint64_t seed, unsigned index) {
  return 1 + splitmix64(splitmix64(seed) + index) % ((uint64_t{1} << 31) - 1);
}

bool choose_tests(schema::TesterRequest::Reader request, schema::TestPlan::Builder out,
                  std::string& error) {
  auto spec = request.getSpec();
  if (spec.getConfigurations().size() == 0) {
    error = "TesterRequest.spec: the spec has no configurations";
    return false;
  }
  auto f = facts_of(request);
  bool thorough = request.getThorough();
  unsigned configs = spec.getConfigurations().size();
  std::string on_configs = configs == 1 ? std::string("its configuration")
                                        : fmt::format("each of its {} configurations", configs);
  bool small = f.max_bytes <= limits::full_bytes && f.flops <= limits::full_flops;
  bool full = thorough && small;
  std::string size_text =
    full ? fmt::format("full shapes ({} of inputs and outputs, {:.3g} flops: within {} and {:.3g})",
                       human_bytes(f.max_bytes), f.flops, human_bytes(limits::full_bytes),
                       limits::full_flops)
         : thorough ? fmt::format("sizes reduced from the candidate's blocks (full shapes are "
                                  "{} and {:.3g} flops, over {} or {:.3g})",
                                  human_bytes(f.max_bytes), f.flops,
                                  human_bytes(limits::full_bytes), limits::full_flops)
                    : std::string("sizes reduced from the candidate's blocks (remainders and "
                                  "two grid steps kept)");
  unsigned mode_seeds = thorough ? limits::thorough_mode_seeds : limits::mode_seeds;

  plan_writer plan(request);
  plan.add({"fresh inputs",
            fmt::format("the spec's generators with seeds the node's own test does not use, "
                        "on {}, at {}", on_configs, size_text),
            thorough ? limits::thorough_fresh_seeds : limits::fresh_seeds, full, "", 0, ""});

  if (!f.free_dims.empty())
    plan.add({"ragged last blocks",
              fmt::format("dims free to change ({}) at sizes that leave a partial last block "
                          "against the candidate's blocks or the (8,128) tile: catches a grid "
                          "of size // block or an unmasked last block (the worker skips a "
                          "configuration whose dims the blocks freeze)",
                          join(f.free_dims)),
              mode_seeds, false, "", 0, "ragged"});

  if (f.float_inputs && f.narrow.empty() && f.relative)
    plan.add({"large magnitudes",
              fmt::format("float inputs x{:g}: overflow past the range a kernel's intermediates "
                          "hold (exp without the row max, float16 accumulators); every float "
                          "output's rtol covers {:g} ulps, so the comparison stays fair when "
                          "atol vanishes next to the outputs (skipped where the reference "
                          "itself is not finite)",
                          limits::large_scale, limits::large_ulps),
              mode_seeds, full, "large", limits::large_scale, ""});

  if (f.float_inputs)
    plan.add({"zeros",
              "float inputs all zero: 0/0 and log(0) in a kernel where the reference guards "
              "them (epsilon, max), accumulators left uninitialised (skipped where the "
              "reference's output is not finite)",
              1, full, "zeros", 0, ""});

  if (thorough && f.float_inputs)
    plan.add({"sparse inputs",
              "half of the float inputs' elements zero: masks, padding and reductions over "
              "mixed zero and non-zero blocks (skipped where the reference's output is not "
              "finite or constant)",
              mode_seeds, full, "sparse", 0, ""});

  plan.write(out);
  (void)error;
  return true;
}

bool judge(schema::JudgeRequest::Reader request, schema::Verdict::Builder out,
           std::string& error) {
  auto cases = request.getPlan().getCases();
  auto results = request.getResults();
  if (cases.size() == 0) {
    error = "JudgeRequest.plan: the plan has no cases";
    return false;
  }
  if (results.size() != cases.size()) {
    error = fmt::format("JudgeRequest.results: {} result{} for {} plan case{} (results[i] "
                        "answers plan.cases[i])",
                        results.size(), results.size() == 1 ? "" : "s", cases.size(),
                        cases.size() == 1 ? "" : "s");
    return false;
  }
  auto spec = request.getSpec();
  out.setSchemaVersion(schema::SCHEMA_VERSION);
  unsigned passed = 0;
  int failed = -1;
  double worst = 0;
  std::vector<std::string> skipped;
  std::string failure;
  for (unsigned i = 0; i < cases.size(); ++i) {
    auto c = judge_case(spec, results[i]);
    worst = std::max(worst, c.ratio);
    std::string name = cases[i].getName();
    if (c.o == outcome::passed)
      ++passed;
    else if (c.o == outcome::skipped)
      skipped.push_back(fmt::format("{} ({})", name, c.reason));
    else if (failed < 0) {
      failed = static_cast<int>(i);
      failure = fmt::format("case {} ({}) failed: {}", i, name, c.reason);
    }
  }
  bool correct = failed < 0 && passed > 0;
  out.setCorrect(correct);
  out.setFailedCase(failed);
  out.setWorstRatio(worst);
  std::string summary;
  if (failed >= 0)
    summary = fmt::format("not correct: {}", failure);
  else if (passed == 0)
    summary = "not correct: no case was checked, every one was skipped";
  else
    summary = fmt::format("correct: {} of {} cases passed", passed, cases.size());
  if (!skipped.empty())
    summary += fmt::format("; skipped: {}", join(skipped, "; "));
  summary += fmt::format("; worst error {} of the allowed", ratio_text(worst));
  out.setSummary(summary);
  return true;
}

}  // namespace maxkernel::agents
