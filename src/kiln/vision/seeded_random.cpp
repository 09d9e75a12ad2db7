#include "kiln/vision/seeded_random.h"

#include <numeric>
#include <utility>

namespace kiln::vision {

std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  // A separate stream from the augmentation draws (which use sample indices 0..n-1).
  std::uint64_t state = sample_random_bits(seed, epoch, -1, 0x5348554646ULL);  // "SHUFF"
  for (std::int64_t i = n - 1; i > 0; --i) {
    state = splitmix64(state);
    auto j = static_cast<std::int64_t>(bounded(state, static_cast<std::uint64_t>(i + 1)));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

}  // namespace kiln::vision
