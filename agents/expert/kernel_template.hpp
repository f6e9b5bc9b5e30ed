// One family of the expert brain's Pallas TPU kernels (agents/expert/templates/*.py): how it
// recognises a reference (pattern matching on the analyze summary, never on names), the
// parameters it exposes to the strategy playbook, and how it renders a kernel module.
// Deterministic: the same graph, spec, chip and params give the same source.
#pragma once

#include "agents/expert/graph_view.hpp"
#include "config/chip.hpp"
#include "maxkernel/schema/kernel_spec.capnp.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace maxkernel::agents::expert {

// What a matcher found: everything render() needs, as data (so a child candidate is
// rendered again from its parent's params without guessing).
struct template_match {
  std::string family;       // the template's name()
  std::string summary;      // one line: what was recognised, with the sizes
  nlohmann::json facts;     // template-specific: dims, operand roles, generated code
  double score = 1.0;       // preference among several matching templates (higher first)
};

// A parameter the playbook may change.
struct tunable {
  enum class kind {
    block,    // a block size along one dimension: a multiple of `align` dividing `extent`,
              // or `extent` itself
    choice,   // one of `choices` (JSON literals)
  };
  std::string name;
  kind what = kind::block;
  int64_t extent = 0;       // block: the size of the dimension it tiles (configuration 0)
  int64_t align = 1;        // block: required multiple (sublane/lane/MXU rules)
  int grid_axis = -1;       // the grid axis this block size sets (-1: none), of pallas_call `call`
  int call = 0;
  bool reduction = false;   // block: the axis is reduced (accumulated over)
  std::vector<nlohmann::json> choices;  // choice: the allowed values
  std::string meaning;      // for rationales: "rows of x per block"
};

class kernel_template {
public:
  virtual ~kernel_template() = default;
  virtual std::string name() const = 0;
  // One sentence: what family of computations it covers.
  virtual std::string covers() const = 0;
  // nullopt when the reference is not of this family.
  virtual std::optional<template_match> match(const graph_view& graph,
                                              schema::KernelSpec::Reader spec) const = 0;
  // A good first point for the chip: aligned blocks that fit the scoped VMEM limit.
  virtual nlohmann::json initial_params(const template_match& m,
                                        const config::chip& chip) const = 0;
  virtual std::vector<tunable> tunables(const template_match& m) const = 0;
  // VMEM the kernel needs with these params (double-buffered blocks + scratch), in bytes.
  virtual int64_t vmem_bytes(const template_match& m, const nlohmann::json& params) const = 0;
  // The kernel module's source, or an error naming the parameter that is out of range.
  virtual bool render(const template_match& m, const nlohmann::json& params,
                      std::string& source, std::string& error) const = 0;
};

using template_ptr = std::shared_ptr<const kernel_template>;

}  // namespace maxkernel::agents::expert
