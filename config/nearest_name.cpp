#include "config/nearest_name.hpp"

#include <algorithm>
#include <cctype>

namespace maxkernel::config {

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                  std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string nearest_name(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.size() > 64)  // not a typo of a short key; skip the quadratic work
    return {};
  std::string best;
  size_t best_distance = SIZE_MAX, best_prefix = 0;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    // Ties go to the longer shared prefix: "v6" is closer to "v6e" than to "v4".
    size_t prefix = 0;
    while (prefix < word.size() && prefix < c.size() && word[prefix] == c[prefix])
      ++prefix;
    if (d < best_distance || (d == best_distance && prefix > best_prefix)) {
      best_distance = d;
      best_prefix = prefix;
      best = c;
    }
  }
  size_t allowed = std::max<size_t>(2, std::max(word.size(), best.size()) / 3);
  // Replacing every character of the word is no typo ("N" is not a misspelt "M").
  return best_distance <= allowed && best_distance < word.size() ? best : std::string{};
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i)
      out += ", ";
    out += names[i];
  }
  return out;
}

}  // namespace maxkernel::config
