#pragma once
// Random draws of a checkpointed function, replayed when it is recomputed (checkpoint.h).
// Kiln's random numbers are counter based: a draw is a (seed, offset) pair, or, for graph-safe
// dropout, a seed and an int64 offset counter on the device. A stateful random module (Dropout)
// advances its own offset at every draw, so running a function a second time would draw other
// numbers. While a checkpointed function first runs, every such draw is recorded; while it is
// recomputed, the module asks for the recorded draw instead and leaves its own state alone, so
// the recomputed dropout masks equal the first run's and the module's position is unchanged.
//
// A stateful random module calls, at each draw:
//   if (auto d = autograd::replayed_random_draw()) { use *d; do not advance; }
//   else { draw as usual; if (autograd::recording_random_draws()) autograd::record_random_draw(...); }
// Plain functions with explicit keys (dropout(x, p, training, seed, offset)) need nothing.
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

struct RandomDraw {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // host-offset draws
  Tensor device_offset;      // graph-safe draws: a copy of the device counter before the draw
};

// The draws of one checkpointed call, in order.
class RandomTape {
 public:
  const std::vector<RandomDraw>& draws() const { return draws_; }
  std::size_t replayed() const { return cursor_; }

 private:
  friend class RandomTapeScope;
  friend void record_random_draw(RandomDraw draw);
  friend std::optional<RandomDraw> replayed_random_draw();
  std::vector<RandomDraw> draws_;
  std::size_t cursor_ = 0;
};

// While alive, the tape records (replay=false) or replays from its first draw (replay=true).
// Scopes nest (a checkpoint inside a checkpointed function); thread-local.
class RandomTapeScope {
 public:
  RandomTapeScope(RandomTape& tape, bool replay);
  ~RandomTapeScope();
  RandomTapeScope(const RandomTapeScope&) = delete;
  RandomTapeScope& operator=(const RandomTapeScope&) = delete;
};

// True when some scope records draws.
bool recording_random_draws();
void record_random_draw(RandomDraw draw);
// During a recompute: the next recorded draw (also recorded into any inner recording scope).
// nullopt when no scope replays. Running past the recorded draws is an error.
std::optional<RandomDraw> replayed_random_draw();

}  // namespace kiln::autograd
