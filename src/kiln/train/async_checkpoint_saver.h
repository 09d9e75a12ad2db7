#pragma once
// AsyncCheckpointSaver: checkpoint saves that cost the training step only a host copy. save()
// copies the tensors into one host arena (page-locked when a GPU is present, so the device-to-host
// copy runs at full speed; reused from save to save) and a background thread writes the copy to
// the CheckpointStore while training goes on. At most one save is in flight: a save asked for
// while the previous one is still writing waits for it (that wait is part of the reported stall).
// An error of the background save (a full disk, a kill of the folder) is thrown by the next
// save(), check() or wait(), naming the iteration; check() is one atomic load while all is well,
// so a trainer calls it every step.
//
//   AsyncCheckpointSaver saver(store, /*async=*/true);
//   SaveStall stall = saver.save(content);   // returns after the host copy
//   ...; saver.check();                      // each step: surfaces a failed background save
//   saver.wait();                            // at the end: the last save is on disk (or throws)
//
// With async false, save() writes before returning (the stall is the whole save).
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#include "kiln/runtime/pinned_memory.h"
#include "kiln/train/checkpoint_store.h"

namespace kiln::train {

struct SaveStall {
  double wait_seconds = 0;   // waiting for the previous save to finish
  double copy_seconds = 0;   // copying the state to the host arena (async) ...
  double write_seconds = 0;  // ... or writing the checkpoint (sync)
  std::uint64_t bytes = 0;   // tensor bytes in the checkpoint
  double total() const { return wait_seconds + copy_seconds + write_seconds; }
};

// The tensors of `live`, copied into `arena` (grown when too small) as host tensors viewing it.
CheckpointContent copy_to_host_arena(const CheckpointContent& live, PinnedBuffer& arena, std::size_t& arena_bytes);

class AsyncCheckpointSaver {
 public:
  AsyncCheckpointSaver(CheckpointStore& store, bool async);
  // Waits for a save in flight; its error, if any, goes to stderr (a destructor cannot throw).
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  SaveStall save(const CheckpointContent& live);
  // Allocates (and page-locks) the host arena for a state shaped like `like` on the background
  // thread, so that the first save costs the step a copy, not the allocation: page-locking 16 GB
  // took 6 s on the H200 machine, a tenth of a synchronous save's stall there. A trainer calls it
  // once its state has its final shapes (after the first optimizer step); a save asked for before
  // it finishes waits for it. Without async, it does nothing.
  void reserve(const CheckpointContent& like);
  void check();
  void wait();
  bool async() const { return async_; }
  // Bytes of the host arena (0 before the first save or reservation); read it after wait().
  std::size_t arena_bytes() const { return arena_bytes_; }
  // Seconds the last completed background write took (0 before the first).
  double last_write_seconds() const { return last_write_seconds_.load(); }

 private:
  void join_and_rethrow();
  CheckpointStore& store_;
  bool async_;
  std::thread worker_;
  std::atomic<bool> finished_{true};
  std::exception_ptr error_;  // set by the worker before finished_
  std::int64_t in_flight_iteration_ = -1;
  CheckpointContent snapshot_;  // what the worker writes (views of arena_)
  PinnedBuffer arena_;
  std::size_t arena_bytes_ = 0;
  std::atomic<double> last_write_seconds_{0};
};

}  // namespace kiln::train
