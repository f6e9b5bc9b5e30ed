// Builders for the tester's tests: native KernelSpecs described in a few lines (dims,
// inputs by dim names, outputs, tolerances) and EvalResults with the phases and TestCases a
// worker reports.
#pragma once

#include "maxkernel/schema/agent.capnp.h"

#include <capnp/message.h>

#include <cctype>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace maxkernel::tests {

struct input_spec {
  std::string name;
  std::vector<std::string> dims;  // a dim name per axis, or a number for a literal axis
  std::string dtype = "float32";
  bool structural = false;
  bool is_static = false;
};

struct spec_desc {
  std::vector<std::pair<std::string, int64_t>> dims;        // name -> size
  std::map<std::string, std::string> derived;               // name -> expression
  std::vector<input_spec> inputs;
  std::vector<std::pair<std::vector<std::string>, std::string>> outputs;   // dims, dtype
  std::vector<std::tuple<int, double, double>> tolerances;  // output, atol, rtol
  bool named = true;   // false: a JAXBench-like spec (no dims, literal shapes)
  double flops = 0;
};

inline int64_t size_of(const spec_desc& d, const std::string& axis) {
  for (auto& [n, s] : d.dims)
    if (n == axis)
      return s;
  return std::stoll(axis);
}

inline void fill_spec(schema::KernelSpec::Builder spec, const spec_desc& d) {
  spec.setSchemaVersion(schema::SCHEMA_VERSION);
  spec.setName("tester_case");
  spec.setFormat(d.named ? schema::SpecFormat::NATIVE : schema::SpecFormat::JAXBENCH);
  spec.setReference("def reference(*args):\n    return args[0]\n");
  spec.setFlops(d.flops);
  if (d.named) {
    auto dims = spec.initDims(static_cast<unsigned>(d.dims.size()));
    for (unsigned i = 0; i < d.dims.size(); ++i) {
      dims[i].setName(d.dims[i].first);
      dims[i].setSize(d.dims[i].second);
      auto it = d.derived.find(d.dims[i].first);
      if (it != d.derived.end())
        dims[i].setExpression(it->second);
    }
  }
  auto config = spec.initConfigurations(1)[0];
  config.setName("default");
  auto inputs = config.initInputs(static_cast<unsigned>(d.inputs.size()));
  for (unsigned i = 0; i < d.inputs.size(); ++i) {
    const auto& in = d.inputs[i];
    auto dst = inputs[i];
    dst.setName(in.name);
    dst.setIsStatic(in.is_static);
    dst.setStructural(in.structural);
    if (in.is_static) {
      dst.setStaticValue("4");
      continue;
    }
    auto type = dst.initType();
    type.setDtype(in.dtype);
    auto shape = type.initShape(static_cast<unsigned>(in.dims.size()));
    auto names = dst.initDimNames(d.named ? static_cast<unsigned>(in.dims.size()) : 0);
    for (unsigned a = 0; a < in.dims.size(); ++a) {
      shape.set(a, size_of(d, in.dims[a]));
      bool literal = !in.dims[a].empty() && std::isdigit(static_cast<unsigned char>(in.dims[a][0]));
      if (d.named)
        names.set(a, literal ? "" : in.dims[a]);
    }
  }
  auto outputs = config.initOutputs(static_cast<unsigned>(d.outputs.size()));
  for (unsigned k = 0; k < d.outputs.size(); ++k) {
    outputs[k].setDtype(d.outputs[k].second);
    auto shape = outputs[k].initShape(static_cast<unsigned>(d.outputs[k].first.size()));
    for (unsigned a = 0; a < d.outputs[k].first.size(); ++a)
      shape.set(a, size_of(d, d.outputs[k].first[a]));
  }
  auto tols = spec.initTolerances(static_cast<unsigned>(d.tolerances.size()));
  for (unsigned i = 0; i < d.tolerances.size(); ++i) {
    tols[i].setOutput(std::get<0>(d.tolerances[i]));
    tols[i].setAtol(std::get<1>(d.tolerances[i]));
    tols[i].setRtol(std::get<2>(d.tolerances[i]));
  }
}

// A bf16 matmul (M, K) x (K, N) with one tolerance for every output.
inline spec_desc matmul_desc(int64_t m, int64_t k, int64_t n, const std::string& dtype,
                             double tol) {
  spec_desc d;
  d.dims = {{"M", m}, {"K", k}, {"N", n}};
  d.inputs = {{"a", {"M", "K"}, dtype}, {"b", {"K", "N"}, dtype}};
  d.outputs = {{{"M", "N"}, dtype}};
  d.tolerances = {{-1, tol, tol}};
  d.flops = 2.0 * static_cast<double>(m * k * n);
  return d;
}

inline void fill_tester_request(schema::TesterRequest::Builder r, const spec_desc& d,
                                uint64_t seed, bool thorough, const std::string& chip = "v5e") {
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  fill_spec(r.initSpec(), d);
  r.setChip(chip);
  r.setSeed(seed);
  r.setThorough(thorough);
}

struct test_case_desc {
  bool passed = true;
  int output = 0;
  double max_abs = 0;
  double max_rel = 0;
};

struct result_desc {
  // phase, status, error class, message
  std::vector<std::tuple<schema::Phase, schema::Status, schema::ErrorClass, std::string>> phases;
  bool correct = true;
  std::vector<test_case_desc> cases;
};

inline result_desc passed_result(double max_abs, double max_rel) {
  result_desc r;
  r.phases = {{schema::Phase::LOAD, schema::Status::OK, schema::ErrorClass::NONE, ""},
              {schema::Phase::LOWER, schema::Status::OK, schema::ErrorClass::NONE, ""},
              {schema::Phase::PROFILE, schema::Status::OK, schema::ErrorClass::NONE, ""},
              {schema::Phase::TEST, schema::Status::OK, schema::ErrorClass::NONE, ""}};
  r.cases = {{true, 0, max_abs, max_rel}};
  return r;
}

inline result_desc failed_result(schema::ErrorClass cls, const std::string& message,
                                 std::vector<test_case_desc> cases) {
  auto r = passed_result(0, 0);
  std::get<1>(r.phases[3]) = schema::Status::FAILED;
  std::get<2>(r.phases[3]) = cls;
  std::get<3>(r.phases[3]) = message;
  r.correct = false;
  r.cases = std::move(cases);
  return r;
}

inline result_desc skipped_result(const std::string& why) {
  auto r = passed_result(0, 0);
  std::get<1>(r.phases[3]) = schema::Status::SKIPPED;
  std::get<3>(r.phases[3]) = why;
  r.correct = false;
  r.cases.clear();
  return r;
}

inline void fill_result(schema::EvalResult::Builder r, const result_desc& d) {
  r.setSchemaVersion(schema::SCHEMA_VERSION);
  r.setCorrect(d.correct);
  auto phases = r.initPhases(static_cast<unsigned>(d.phases.size()));
  for (unsigned i = 0; i < d.phases.size(); ++i) {
    phases[i].setPhase(std::get<0>(d.phases[i]));
    phases[i].setStatus(std::get<1>(d.phases[i]));
    phases[i].setErrorClass(std::get<2>(d.phases[i]));
    phases[i].setMessage(std::get<3>(d.phases[i]));
  }
  auto cases = r.initTest().initCases(static_cast<unsigned>(d.cases.size()));
  for (unsigned i = 0; i < d.cases.size(); ++i) {
    cases[i].setKind("fresh");
    cases[i].setPassed(d.cases[i].passed);
    cases[i].setOutput(d.cases[i].output);
    cases[i].setMaxAbsErr(d.cases[i].max_abs);
    cases[i].setMaxRelErr(d.cases[i].max_rel);
  }
}

// A JudgeRequest: the spec, a plan with one case per result (named), the results.
inline void fill_judge_request(schema::JudgeRequest::Builder j, const spec_desc& d,
                               const std::vector<std::string>& names,
                               const std::vector<result_desc>& results) {
  j.setSchemaVersion(schema::SCHEMA_VERSION);
  fill_spec(j.initSpec(), d);
  auto plan = j.initPlan();
  plan.setSchemaVersion(schema::SCHEMA_VERSION);
  auto cases = plan.initCases(static_cast<unsigned>(names.size()));
  for (unsigned i = 0; i < names.size(); ++i)
    cases[i].setName(names[i]);
  auto rs = j.initResults(static_cast<unsigned>(results.size()));
  for (unsigned i = 0; i < results.size(); ++i)
    fill_result(rs[i], results[i]);
}

}  // namespace maxkernel::tests
