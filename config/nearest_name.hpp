// "Did you mean ...?" for misspelled keys and names.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace maxkernel::config {

// The candidate closest to `word` by edit distance, or "" when none is close enough to be
// a plausible typo.
std::string nearest_name(std::string_view word, const std::vector<std::string>& candidates);

// "a, b, c" for messages.
std::string join_names(const std::vector<std::string>& names);

}  // namespace maxkernel::config
