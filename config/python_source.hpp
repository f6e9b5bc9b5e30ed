// A cheap syntactic check of Python sources in a spec: does it define a given function?
// (The worker imports it for real; this only catches the obvious mistakes early, with a line.)
#pragma once

#include <string_view>

namespace maxkernel::config {

// True when a line of `source` starts, after indentation 0, with `def NAME(` (or
// `async def NAME(`), allowing spaces between the tokens.
bool defines_function(std::string_view source, std::string_view name);

}  // namespace maxkernel::config
