#pragma once
// The global source of random seeds. Kiln's random numbers are counter-based (Philox, see
// ops/philox.h): a tensor's values depend only on a (seed, offset) pair, so a Generator does not
// hold a state to advance through numbers; it hands out disjoint (seed, offset) ranges. Each
// draw reserves `count` counters, so consecutive draws never reuse numbers, and the same
// manual_seed() followed by the same sequence of draws gives the same values on every device.
#include <cstdint>
#include <mutex>

namespace kiln {

struct RandomKey {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // first Philox counter of the range
};

class Generator {
 public:
  explicit Generator(std::uint64_t seed = kDefaultSeed) : seed_(seed) {}

  // Restarts the generator: the seed is set and the offset goes back to 0.
  void manual_seed(std::uint64_t seed);
  std::uint64_t seed() const;
  std::uint64_t offset() const;
  void set_offset(std::uint64_t offset);  // for restoring a checkpointed position
  // Reserves `count` counters and returns where they start.
  RandomKey next(std::uint64_t count);
  // A fresh 64-bit seed derived from the generator (for modules that keep their own seed, such
  // as Dropout); reserves one counter.
  std::uint64_t next_seed();

  static constexpr std::uint64_t kDefaultSeed = 0x4b494c4eull;  // "KILN"

 private:
  mutable std::mutex mu_;
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

// The process-wide generator that initialisers and seeded modules draw from by default.
Generator& default_generator();
// Seeds the default generator (like torch.manual_seed).
void manual_seed(std::uint64_t seed);

}  // namespace kiln
