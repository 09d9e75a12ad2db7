#pragma once
// One step of Boost's hash_combine: folds `v` into the running hash `h`. The plan caches of the
// cuBLASLt and cuDNN wrappers (ops/cuda, te/cuda) hash their keys' fields with it, in order.
#include <cstddef>
#include <cstdint>

namespace kiln {

constexpr void hash_mix(std::size_t& h, std::uint64_t v) {
  h ^= static_cast<std::size_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
}

}  // namespace kiln
