#include "kiln/autograd/random_replay.h"

namespace kiln::autograd {

namespace {

struct ActiveTape {
  RandomTape* tape;
  bool replay;
};

// Innermost last.
thread_local std::vector<ActiveTape> t_tapes;

}  // namespace

RandomTapeScope::RandomTapeScope(RandomTape& tape, bool replay) {
  if (replay) tape.cursor_ = 0;
  t_tapes.push_back({&tape, replay});
}

RandomTapeScope::~RandomTapeScope() { t_tapes.pop_back(); }

bool recording_random_draws() {
  for (const ActiveTape& t : t_tapes)
    if (!t.replay) return true;
  return false;
}

void record_random_draw(RandomDraw draw) {
  for (const ActiveTape& t : t_tapes)
    if (!t.replay) t.tape->draws_.push_back(draw);
}

std::optional<RandomDraw> replayed_random_draw() {
  // The outermost replaying scope decides: an inner checkpoint that first runs during an outer
  // recompute must see the outer run's draws, and records them for its own recompute.
  for (std::size_t i = 0; i < t_tapes.size(); ++i) {
    if (!t_tapes[i].replay) continue;
    RandomTape& tape = *t_tapes[i].tape;
    KILN_CHECK(tape.cursor_ < tape.draws_.size(),
               "checkpoint: the recomputed function drew random numbers {} times or more, its first run {} times "
               "(its control flow must not change between the forward and the recompute)",
               tape.cursor_ + 1, tape.draws_.size());
    RandomDraw draw = tape.draws_[tape.cursor_++];
    for (std::size_t j = i + 1; j < t_tapes.size(); ++j)
      if (!t_tapes[j].replay) t_tapes[j].tape->draws_.push_back(draw);
    return draw;
  }
  return std::nullopt;
}

}  // namespace kiln::autograd
