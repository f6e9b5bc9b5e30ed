// The TPU generations a spec may target: one per chip file (*.yaml) in chips_dir(), so that a
// new generation is a new file and no code.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace maxkernel::config {

// Stems of the chip files in chips_dir(), sorted (v4 v5e v5p v6e v7x in the source tree).
// Read from the directory on every call; empty when it does not exist.
std::vector<std::string> chip_names();
bool is_known_chip(std::string_view name);

// The same for an explicit directory.
std::vector<std::string> chip_names_in(const std::string& dir);

// Whether `name` can name a chip (and its file): 1-64 letters, digits, '_', '-' or '.', not
// starting with '.'.
bool is_chip_name(std::string_view name);

}  // namespace maxkernel::config
