#include "config/kernel_spec_writer.hpp"

#include "maxkernel/schema/common.capnp.h"

#include <type_traits>

namespace maxkernel::config {

namespace {

kj::StringPtr text(const std::string& s) { return kj::StringPtr(s.c_str(), s.size()); }

void write_generator(const input_generator& gen, schema::Generator::Builder out) {
  std::visit(
      [&](const auto& g) {
        using T = std::decay_t<decltype(g)>;
        if constexpr (std::is_same_v<T, normal_generator>) {
          auto n = out.initNormal();
          n.setMean(g.mean);
          n.setStd(g.std);
        } else if constexpr (std::is_same_v<T, uniform_generator>) {
          auto u = out.initUniform();
          u.setLow(g.low);
          u.setHigh(g.high);
        } else if constexpr (std::is_same_v<T, randint_generator>) {
          auto r = out.initRandint();
          r.setLow(g.low);
          r.setHigh(g.high);
        } else if constexpr (std::is_same_v<T, code_generator>) {
          out.setCode(text(g.source));
        } else if constexpr (std::is_same_v<T, zeros_generator>) {
          out.setZeros();
        } else {
          out.setOnes();
        }
      },
      gen);
}

void write_input(const native_input& in, schema::Input::Builder out) {
  out.setName(text(in.name));
  auto type = out.initType();
  auto shape = type.initShape(static_cast<unsigned>(in.shape.size()));
  for (unsigned i = 0; i < in.shape.size(); ++i)
    shape.set(i, in.shape[i]);
  type.setDtype(text(in.dtype));
  write_generator(in.generator, out.initGenerator());
  out.setIsStatic(in.is_static);
  out.setStaticValue(text(in.static_json));
  out.setStructural(in.structural);
  auto names = out.initDimNames(static_cast<unsigned>(in.dim_names.size()));
  for (unsigned i = 0; i < in.dim_names.size(); ++i)
    names.set(i, text(in.dim_names[i]));
}

}  // namespace

void write_kernel_spec(const native_spec& spec, schema::KernelSpec::Builder out) {
  out.setSchemaVersion(schema::SCHEMA_VERSION);
  out.setName(text(spec.name));
  out.setDescription(text(spec.description));
  out.setFormat(schema::SpecFormat::NATIVE);
  out.setSourcePath(text(spec.source_path));

  auto configs = out.initConfigurations(1);
  auto config = configs[0];
  config.setName("default");
  auto inputs = config.initInputs(static_cast<unsigned>(spec.inputs.size()));
  for (unsigned i = 0; i < spec.inputs.size(); ++i)
    write_input(spec.inputs[i], inputs[i]);
  config.initOutputs(0);  // the worker fills them by running the reference

  out.setReference(text(spec.reference));
  out.setReferenceEntry("reference");
  auto tolerances = out.initTolerances(static_cast<unsigned>(spec.tolerances.size()));
  for (unsigned i = 0; i < spec.tolerances.size(); ++i) {
    tolerances[i].setOutput(spec.tolerances[i].output);
    tolerances[i].setAtol(spec.tolerances[i].atol);
    tolerances[i].setRtol(spec.tolerances[i].rtol);
  }
  out.setChip(text(spec.chip));
  out.setBaselinePath(text(spec.baseline_path));
  out.setConfigJson("");
  out.setFlops(0);
  out.setDegenerate(false);
  auto dims = out.initDims(static_cast<unsigned>(spec.dims.size()));
  for (unsigned i = 0; i < spec.dims.size(); ++i) {
    dims[i].setName(text(spec.dims[i].name));
    dims[i].setSize(spec.dims[i].size);
    dims[i].setExpression(text(spec.dims[i].expression));
  }
}

}  // namespace maxkernel::config
