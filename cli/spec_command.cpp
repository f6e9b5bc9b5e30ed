#include "cli/spec_command.hpp"

#include "cli/output_file.hpp"
#include "cli/spec_source.hpp"
#include "messages/capnp_io.hpp"
#include "tpu_nodes/worker_client.hpp"

#include <capnp/compat/json.h>
#include <fmt/format.h>

#include <iostream>
#include <memory>

namespace maxkernel::cli {

namespace {

std::string shape_text(capnp::List<int64_t>::Reader shape, capnp::List<capnp::Text>::Reader names) {
  std::string out = "(";
  for (unsigned i = 0; i < shape.size(); ++i) {
    if (i)
      out += ", ";
    std::string name = i < names.size() ? names[i].cStr() : "";
    out += name.empty() ? std::to_string(shape[i]) : fmt::format("{}={}", name, shape[i]);
  }
  return out + ")";
}

std::string generator_text(schema::Generator::Reader g) {
  switch (g.which()) {
    case schema::Generator::NORMAL:
      return fmt::format("normal(mean {}, std {})", g.getNormal().getMean(), g.getNormal().getStd());
    case schema::Generator::UNIFORM:
      return fmt::format("uniform[{}, {})", g.getUniform().getLow(), g.getUniform().getHigh());
    case schema::Generator::RANDINT:
      return fmt::format("randint[{}, {})", g.getRandint().getLow(), g.getRandint().getHigh());
    case schema::Generator::CODE: return "code";
    case schema::Generator::TASK: return "the task's own code";
    case schema::Generator::ZEROS: return "zeros";
    case schema::Generator::ONES: return "ones";
  }
  return "?";
}

std::string summary(schema::KernelSpec::Reader spec) {
  static const char* formats[] = {"native", "jaxbench", "maxkernel"};
  std::string out = fmt::format("task {} ({}) from {}\n", spec.getName().cStr(),
                                formats[static_cast<int>(spec.getFormat())],
                                spec.getSourcePath().cStr());
  out += fmt::format("  chip {}\n", spec.getChip().cStr());
  if (spec.getDims().size() > 0) {
    out += "  dims";
    for (auto d : spec.getDims())
      out += fmt::format(" {}={}", d.getName().cStr(), d.getSize());
    out += "\n";
  }
  unsigned index = 0;
  for (auto cfg : spec.getConfigurations()) {
    out += fmt::format("  configuration {} {}\n", index++, cfg.getName().cStr());
    for (auto in : cfg.getInputs()) {
      if (in.getIsStatic()) {
        out += fmt::format("    {:<16} static {}\n", in.getName().cStr(), in.getStaticValue().cStr());
        continue;
      }
      out += fmt::format("    {:<16} {} {} {}{}\n", in.getName().cStr(),
                         shape_text(in.getType().getShape(), in.getDimNames()),
                         in.getType().getDtype().cStr(), generator_text(in.getGenerator()),
                         in.getStructural() ? " (structural)" : "");
    }
    for (auto o : cfg.getOutputs())
      out += fmt::format("    -> {} {}\n", shape_text(o.getShape(), {}), o.getDtype().cStr());
  }
  for (auto t : spec.getTolerances())
    out += fmt::format("  tolerance {}: atol {} rtol {}\n",
                       t.getOutput() < 0 ? std::string("all outputs") : fmt::format("output {}", t.getOutput()),
                       t.getAtol(), t.getRtol());
  if (spec.getBaselinePath().size() > 0)
    out += fmt::format("  baseline {}\n", spec.getBaselinePath().cStr());
  if (spec.getFlops() > 0)
    out += fmt::format("  flops {:.4g}\n", spec.getFlops());
  if (spec.getDegenerate())
    out += "  note: the reference's output barely depends on its inputs\n";
  return out;
}

}  // namespace

int run_spec(const spec_options& opts) {
  std::string error;
  auto kind = classify_spec(opts.spec, error);
  if (kind == spec_kind::invalid) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  for (auto* target : {&opts.json, &opts.out})
    if (!output_dir_exists(*target, error)) {
      std::cerr << "error: " << error << "\n";
      return 2;
    }
  // Task directories are Python: only they need a worker.
  std::unique_ptr<tpu_nodes::worker_client> worker;
  if (kind != spec_kind::native) {
    auto wopts = tpu_nodes::worker_options::defaults();
    wopts.memory_limit_bytes = opts.memory_limit_bytes;
    worker = std::make_unique<tpu_nodes::worker_client>(wopts);
    if (!worker->start(error)) {
      std::cerr << "error: " << error << "\n";
      return 3;
    }
  }
  auto loaded = load_spec(opts.spec, kind, opts.chip, opts.memory_limit_bytes,
                          worker ? worker_task_loader(*worker, opts.memory_limit_bytes) : task_loader{});
  if (loaded.exit_code != 0) {
    std::cerr << "error: " << loaded.error << "\n";
    return loaded.exit_code;
  }
  auto msg = messages::decode<schema::KernelSpec>(loaded.spec_bytes, error);
  auto spec = msg->root<schema::KernelSpec>();
  (opts.json == "-" ? std::cerr : std::cout) << summary(spec);
  if (!opts.json.empty()) {
    capnp::JsonCodec codec;
    codec.setPrettyPrint(true);
    if (!write_output(opts.json, std::string(codec.encode(spec).cStr()) + "\n", error)) {
      std::cerr << "error: " << error << "\n";
      return 3;
    }
  }
  if (!opts.out.empty() && !write_output(opts.out, loaded.spec_bytes, error)) {
    std::cerr << "error: " << error << "\n";
    return 3;
  }
  return 0;
}

}  // namespace maxkernel::cli
