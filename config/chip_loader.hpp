// Reading chip files (config/chips/<name>.yaml) into config::chip, and writing back the
// constants `maxkernel calibrate` fits. The format and the sources of the numbers are in
// docs/chips.md.
#pragma once

#include "config/chip.hpp"
#include "config/spec_error.hpp"

#include <string>
#include <string_view>

namespace maxkernel::config {

// Reads and validates one chip file: every field present, no unknown keys, numbers in range,
// `name:` equal to the file's stem. On failure returns false with `error` naming the file,
// line, column and field; `out` is then left untouched. Never throws.
bool load_chip_file(const std::string& path, chip& out, spec_error& error);

// Where the chip files are: $MAXKERNEL_CHIPS_DIR when set, else the source tree's
// config/chips.
std::string chips_dir();

// Loads chips_dir()/<name>.yaml. An unknown name is an error listing the known chips. Each
// (directory, name) is read once per process; later calls copy the cached chip.
bool load_chip(std::string_view name, chip& out, spec_error& error);

// The text of a chip file with the values of its `efficiency:` block replaced by `fitted`
// (comments, layout and every other value kept) and `note` as a `# calibrate: ...` comment
// above the block, replacing an earlier such note. `original_text` must be a valid chip
// file. On failure returns "" and sets `error`.
std::string fitted_chip_yaml(const std::string& original_text, const chip_efficiency& fitted,
                             std::string_view note, std::string& error);

}  // namespace maxkernel::config
