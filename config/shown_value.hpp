// A user's value as it appears inside an error message: one line, at most 40 characters,
// so that a whole reference module pasted in the wrong place does not flood the terminal.
#pragma once

#include <string>
#include <string_view>

namespace maxkernel::config {

std::string shown_value(std::string_view value);

}  // namespace maxkernel::config
