// A validated native spec as plain C++ values, before it becomes a KernelSpec.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace maxkernel::config {

struct normal_generator {
  double mean = 0;
  double std = 1;
};
struct uniform_generator {
  double low = 0;
  double high = 1;
};
struct randint_generator {
  int64_t low = 0;
  int64_t high = 0;  // exclusive
};
struct code_generator {
  std::string source;  // Python defining generate(rng, shape, dtype, dims)
};
struct zeros_generator {};
struct ones_generator {};

using input_generator = std::variant<normal_generator, uniform_generator, randint_generator,
                                     code_generator, zeros_generator, ones_generator>;

struct native_input {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> dim_names;  // per axis; "" for a literal size
  std::string dtype;                   // "" for a static argument
  input_generator generator;
  bool structural = false;
  bool is_static = false;
  std::string static_json;  // JSON literal of a static argument
};

struct named_dim {
  std::string name;
  int64_t size = 0;        // a derived dim's value at the full sizes
  std::string expression;  // "" for a literal size; else what it is derived from (MAX_SEQS + 1)
};

struct output_tolerance {
  int32_t output = -1;  // -1: every output
  double atol = 0;
  double rtol = 0;
};

struct native_spec {
  std::string name;
  std::string description;
  std::string source_path;  // absolute path of the spec file
  std::vector<named_dim> dims;
  std::vector<native_input> inputs;
  std::string reference;  // Python source defining reference(*inputs)
  std::vector<output_tolerance> tolerances;
  std::string chip;           // "" when neither the spec nor the command line names one
  std::string baseline_path;  // absolute; "" without a baseline
};

}  // namespace maxkernel::config
