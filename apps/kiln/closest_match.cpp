#include "closest_match.h"

#include <algorithm>
#include <limits>

namespace kiln::cli {

int edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  // d[i][j]: distance between a's first i and b's first j characters; rows kept whole for the swap.
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  // Leading dashes are the same for every option; they should not make "--x" close to "--y".
  auto bare = [](std::string_view s) { return s.substr(std::min(s.find_first_not_of('-'), s.size())); };
  const std::string_view w = bare(word);
  if (w.empty()) return std::nullopt;
  const int allowed = std::max(2, static_cast<int>(w.size()) / 3);
  int best = std::numeric_limits<int>::max();
  const std::string* best_candidate = nullptr;
  for (const auto& c : candidates) {
    int d = edit_distance(w, bare(c));
    if (d < best) best = d, best_candidate = &c;
  }
  if (best_candidate && best <= allowed && best < static_cast<int>(w.size())) return *best_candidate;
  // A prefix of exactly one candidate ("train" for "train-cifar10", "--dev" for "--device").
  std::vector<const std::string*> extending;
  for (const auto& c : candidates)
    if (bare(c).starts_with(w)) extending.push_back(&c);
  if (extending.size() == 1 && w.size() >= 2) return *extending.front();
  return std::nullopt;
}

}  // namespace kiln::cli
