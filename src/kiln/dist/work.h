#pragma once
// Work: a collective or a batch of sends/receives that has been started (collectives.h). The
// call that returns it only enqueues: nothing in it blocks the host.
//
// Device buffers (NCCL): the work is queued on the stream the caller named; event() is recorded
// on that stream right after it. wait() makes the device's current stream wait for it (the host
// does not block; as PyTorch's Work.wait() for NCCL), synchronize() blocks the host.
// Host buffers (MPI non-blocking calls): the transfer progresses inside MPI calls; wait() and
// synchronize() complete it (and finish what the call does after the transfer: rounding a
// reduced-precision result back from f32, dividing an average, copying into per-rank outputs),
// after which event() is recorded. Until then the buffers must be left alone.
//
// Destroying unfinished host work waits for it (MPI may still write into the buffers).
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/runtime/event.h"
#include "kiln/runtime/stream.h"

namespace kiln::dist {

class Work {
 public:
  Work();  // already complete
  ~Work();
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  void wait();
  void synchronize();
  // True once the work is done (host: tests the MPI requests, letting them progress).
  bool is_completed();
  // Device work: recorded on the collective's stream after it (wait() on it from any stream).
  // Host work: recorded when it completed (wait() first).
  const Event& event() const;

  // For collectives.cpp: how a started call is finished.
  struct State;
  explicit Work(std::unique_ptr<State> state);
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

}  // namespace kiln::dist
