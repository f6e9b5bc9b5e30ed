// `maxkernel template SPEC [--name T] [--params JSON] [--chip C] [--out FILE] [--json FILE|-]
// [--children-dir DIR [--children N]]`:
// which expert templates match the reference (read from its analyze summary), their
// parameters and VMEM, and the kernel the chosen one renders; with --children-dir also the
// strategy playbook's first N children of it (DIR/child_<i>.py, no profile: exploration moves). For users who want to see what
// the expert brain recognises, and for template authors.
#pragma once

#include <cstdint>
#include <string>

namespace maxkernel::cli {

struct template_options {
  std::string spec;
  std::string name;          // "" = the best match
  std::string params;        // JSON object merged over the initial params
  std::string chip;
  std::string out;           // kernel file to write ("" = none)
  std::string children_dir;  // write the playbook's children of the rendered kernel here
  unsigned children = 3;     // how many children (best-ranked first)
  std::string json;
  std::string state_dir;
  double deadline_seconds = 600;
  uint64_t memory_limit_bytes = 8ull << 30;
};

int run_template(const template_options& opts);

}  // namespace maxkernel::cli
