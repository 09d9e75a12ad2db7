#pragma once
// Seeded shuffling that gives the same order on every platform and standard library:
// std::mt19937_64's output is fixed by the standard, std::uniform_int_distribution's is not, so
// the bounded draw is done here (rejection sampling, unbiased).
#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace kiln::data {

// A uniform integer in [0, bound] (bound >= 0).
inline std::uint64_t draw_at_most(std::mt19937_64& rng, std::uint64_t bound) {
  if (bound == ~std::uint64_t{0}) return rng();
  std::uint64_t range = bound + 1;
  std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % range + 1) % range;
  std::uint64_t r;
  do {
    r = rng();
  } while (r > limit);
  return r % range;
}

// Fisher-Yates.
template <typename T>
void seeded_shuffle(std::span<T> values, std::mt19937_64& rng) {
  for (std::size_t i = values.size(); i > 1; --i) {
    std::size_t j = static_cast<std::size_t>(draw_at_most(rng, i - 1));
    std::swap(values[i - 1], values[j]);
  }
}

}  // namespace kiln::data
