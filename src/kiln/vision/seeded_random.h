#pragma once
// Counter-based random numbers for data loading: every draw is a pure function of (seed, epoch,
// sample index), so shuffles and augmentations are the same whatever the number of worker
// threads, the batch size, or the order in which threads run, and a GPU kernel can draw the same
// numbers as the CPU loader. SplitMix64 (Steele, Lea, Flood 2014) is the mixing function: it is
// tiny, passes BigCrush, and is trivial to rewrite in a CUDA kernel.
#include <cstdint>
#include <vector>

namespace kiln::vision {

inline constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// 64 random bits for draw `stream` of sample `index` in `epoch`.
inline constexpr std::uint64_t sample_random_bits(std::uint64_t seed, std::int64_t epoch, std::int64_t index,
                                                  std::uint64_t stream) {
  std::uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<std::uint64_t>(epoch));
  h = splitmix64(h ^ static_cast<std::uint64_t>(index));
  return splitmix64(h ^ stream);
}

// A number in [0, n) from 64 random bits: the high half of the 128-bit product bits * n
// (Lemire's multiply-shift, without rejection: the bias is below n / 2^64). On CUDA: __umul64hi.
__extension__ typedef unsigned __int128 uint128_for_bounded;  // GCC/Clang extension, pedantic-clean
inline constexpr std::uint64_t bounded(std::uint64_t bits, std::uint64_t n) {
  return static_cast<std::uint64_t>((static_cast<uint128_for_bounded>(bits) * n) >> 64);
}

// The order in which epoch `epoch` visits the indices 0..n-1: a Fisher-Yates shuffle driven by
// (seed, epoch). Different epochs give different orders; the same (seed, epoch) the same order.
std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

}  // namespace kiln::vision
