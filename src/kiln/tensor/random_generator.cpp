#include "kiln/tensor/random_generator.h"

namespace kiln {

void Generator::manual_seed(std::uint64_t seed) {
  std::lock_guard lock(mu_);
  seed_ = seed;
  offset_ = 0;
}

std::uint64_t Generator::seed() const {
  std::lock_guard lock(mu_);
  return seed_;
}

std::uint64_t Generator::offset() const {
  std::lock_guard lock(mu_);
  return offset_;
}

void Generator::set_offset(std::uint64_t offset) {
  std::lock_guard lock(mu_);
  offset_ = offset;
}

RandomKey Generator::next(std::uint64_t count) {
  std::lock_guard lock(mu_);
  RandomKey key{seed_, offset_};
  offset_ += count;
  return key;
}

std::uint64_t Generator::next_seed() {
  RandomKey key = next(1);
  // SplitMix64 of (seed, offset): a well-mixed, reproducible seed.
  std::uint64_t z = key.seed ^ (key.offset * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(std::uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kiln
